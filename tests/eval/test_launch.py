"""launch/eval.py: flags and config overrides reach ``evaluate_checkpoint`` (replaced by a
recorder, so no model runs), required flags are enforced, the headline is printed."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """
import dataclasses, json, runpy, sys
import pyvision_jax.wiring.evaluation as pipeline
import pyvision_jax.wiring.validation as validation
from pyvision_jax.eval.metrics import summarize

RECORD = sys.argv[1]

def record(config, checkpoint, data, out, **kwargs):
    with open(RECORD, "w") as f:
        json.dump({"checkpoint": str(checkpoint), "data": str(data), "out": str(out),
                   "kwargs": kwargs, "temperature": config.eval.temperature,
                   "max_batch": config.rollout.max_batch,
                   "settings": dataclasses.asdict(pipeline.eval_settings(config, progress=False)),
                   "max_total_tokens": config.eval.max_total_tokens}, f)
    return {**summarize([]), "wall_time_s": 1.5}

pipeline.evaluate_checkpoint = record
validation.validate_evaluation = lambda config, data, checkpoint=None: None  # the paths here are made up
sys.argv = sys.argv[2:]  # launch/eval.py and its flags
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def launch(tmp_path, *args):
    record = tmp_path / "call.json"
    command = [sys.executable, "-c", RECORDER, str(record), str(ROOT / "launch" / "eval.py"), *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    return done, (json.loads(record.read_text()) if record.is_file() else None)


def test_flags_and_overrides_reach_the_evaluation(tmp_path):
    done, call = launch(
        tmp_path,
        "--config",
        str(ROOT / "configs" / "tiny_cpu.py"),
        "--checkpoint",
        "/ckpt",
        "--data",
        "/data.jsonl",
        "--out",
        "/out",
        "--k",
        "32",
        "--max-tool-calls",
        "7",
        "--config.eval.temperature=0.5",
        "--config.rollout.max_batch=3",
        "--config.eval.seed=5",
        "--config.eval.top_k=3",
        "--config.eval.tasks_per_batch=2",
        "--config.eval.report_rollouts_per_task=1",
        "--config.eval.max_total_tokens=2048",
        "--noprogress",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert call == {
        "checkpoint": "/ckpt",
        "data": "/data.jsonl",
        "out": "/out",
        "kwargs": {"k": 32, "max_tool_calls": 7, "progress": False},
        "temperature": 0.5,
        "max_batch": 3,
        "max_total_tokens": 2048,
        "settings": {
            "k": 4,
            "seed": 5,
            "temperature": 0.5,
            "top_p": 1.0,
            "top_k": 3,
            "tasks_per_batch": 2,
            "report": True,
            "report_rollouts_per_task": 1,
            "progress": False,
        },
    }
    assert json.loads(done.stdout[: done.stdout.index("}") + 1])["wall_time_s"] == 1.5
    assert "report:  /out/report.html" in done.stdout


def test_missing_required_flags_are_named(tmp_path):
    done, call = launch(tmp_path, "--checkpoint", "/ckpt", "--out", "/out")
    assert done.returncode != 0 and call is None
    assert "--data is required" in done.stderr


def test_report_all_shows_every_rollout_whatever_the_config_says(tmp_path):
    common = ["--config", str(ROOT / "configs" / "tiny_cpu.py"), "--data", "/d.jsonl", "--out", "/o", "--noprogress"]
    done, call = launch(tmp_path, *common, "--config.eval.report_rollouts_per_task=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert call["settings"]["report_rollouts_per_task"] == 2
    done, call = launch(tmp_path, *common, "--config.eval.report_rollouts_per_task=2", "--report-all")
    assert done.returncode == 0, done.stderr[-3000:]
    assert call["settings"]["report_rollouts_per_task"] == 0
