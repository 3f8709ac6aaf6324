"""benchmarks/main_job_time.py in miniature: the main job and its reference, each from a fresh
workdir, one step each; the report holds both runs, their held-out figures and the ratio."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MINIATURE = ["--config.train.steps=1", "--config.eval.heldout_per_kind=1", "--config.rl.batch_groups=2"]


def benchmark(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.main_job_time", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)


def test_a_miniature_run_times_the_job_and_its_reference_alternately_and_compares_their_heldout_figures(tmp_path):
    out = tmp_path / "main_job_time.json"
    done = benchmark("--pairs=1", f"--out={out}", *MINIATURE)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert [r["variant"] for r in report["runs"]] == ["reference", "default"]
    assert report["overrides"] == MINIATURE
    assert "--config.rollout.max_batch=32" in report["reference_overrides"]
    for run in report["runs"]:
        assert run["wall_s"] > 0 and [s["step"] for s in run["steps"]] == [1]
        assert run["steps"][0]["step_s"] > 0 and run["steps"][0]["wait_s"] > 0
        assert set(run["heldout"]) >= {"before", "after_step_1"}
        assert "out_dir" not in run["heldout"]["before"]  # no temporary paths in the report
        assert 0.0 <= run["heldout"]["after_step_1"]["accuracy"] <= 1.0
    reference, default = report["runs"]
    assert report["median_wall_s"] == {"reference": reference["wall_s"], "default": default["wall_s"]}
    assert report["ratio_reference_to_default"] == reference["wall_s"] / default["wall_s"]
    assert report["heldout_identical"] == (reference["heldout"] == default["heldout"])
    assert f"reference / default: {report['ratio_reference_to_default']:.2f}x" in done.stdout
    assert done.stdout.count(" run 0: ") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--pairs=0"], "--pairs must be >= 1"), (["--steps=3"], "only --config.x=y goes to the runs")],
)
def test_bad_arguments_are_refused_before_any_run(args, message):
    done = benchmark(*args)
    assert done.returncode == 2 and message in done.stderr
    assert " run 0: " not in done.stdout
