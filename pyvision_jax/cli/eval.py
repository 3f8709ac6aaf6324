"""Evaluate a checkpoint on a task file: k rollouts per task, scored, with an HTML report.

    # the config's own model (configs/tiny_cpu.py: the packaged SFT checkpoint)
    pyvision-eval --config configs/tiny_cpu.py --data /tmp/tasks/counting.jsonl --k 4 --out /tmp/ev

    # an HF checkpoint (config.json + safetensors; its tokenizer files are used)
    pyvision-eval --config configs/pyvision_image_7b.py \
        --checkpoint /models/PyVision-Image-7B --data /data/vstar.jsonl --k 32 --out /runs/eval_vstar

    # a training checkpoint (the trainer's workdir, its checkpoints/ dir or one step dir)
    pyvision-eval --config configs/tiny_cpu.py --checkpoint /tmp/pyvision_tiny \
        --data /tmp/pyvision_tiny/tasks/counting.jsonl --k 4 --out /tmp/pyvision_tiny_eval

A params checkpoint written by ``pyvision-convert hf2flax`` works the same way. The output
directory gets results.json, trajectories.jsonl, media/ (each distinct image once) and
report.html (up to eval.report_rollouts_per_task rollouts of each task; --report-all shows every
one); rerunning the same command skips the tasks already finished there. Override any config
field with --config.x=y, e.g. --config.rollout.max_batch=16 --config.eval.temperature=0.6.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from pyvision_jax.cli.default_config import DEFAULT_CONFIG
from pyvision_jax.cli.entry import run_command
from pyvision_jax.cli.user_errors import bad_input_exits, failed_writes_exit
from pyvision_jax.wiring import evaluation, validation

_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Config file.", lock_config=True)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    None,
    "HF directory, params checkpoint or training checkpoint (default: "
    "the config's own model, e.g. the packaged SFT checkpoint of "
    "configs/tiny_cpu.py).",
)
_DATA = flags.DEFINE_string("data", None, "Task file (.jsonl or .json).")
_OUT = flags.DEFINE_string(
    "out", None, "Output directory (results.json, trajectories.jsonl, report.html); reused to resume."
)
_K = flags.DEFINE_integer("k", None, "Rollouts per task (default: config eval.k).")
_MAX_TOOL_CALLS = flags.DEFINE_integer(
    "max-tool-calls", None, "Tool-call budget per episode (default: config eval.max_tool_calls)."
)
_REPORT_ALL = flags.DEFINE_bool(
    "report-all",
    False,
    "Show every rollout of each task in report.html (default: config eval.report_rollouts_per_task).",
)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars.")

PROGRAM = "pyvision-eval"
_HEADLINE = (
    "accuracy",
    "avg_at_k",
    "pass_at_k",
    "num_tasks",
    "num_rollouts",
    "mean_visual_tokens_per_task",
    "mean_response_tokens",
    "wall_time_s",
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for name, holder in (("--data", _DATA), ("--out", _OUT)):
        if not holder.value:
            raise app.UsageError(f"{name} is required")
    with bad_input_exits(PROGRAM):
        validation.validate_evaluation(_CONFIG.value, _DATA.value, _CHECKPOINT.value)
    if _REPORT_ALL.value:
        _CONFIG.value.eval.report_rollouts_per_task = 0
    with failed_writes_exit(PROGRAM):
        results = evaluation.evaluate_checkpoint(
            _CONFIG.value,
            _CHECKPOINT.value,
            _DATA.value,
            _OUT.value,
            k=_K.value,
            max_tool_calls=_MAX_TOOL_CALLS.value,
            progress=_PROGRESS.value,
        )
    print(json.dumps({key: results[key] for key in _HEADLINE}, indent=1))
    video = results["video_token_efficiency"]
    if video["num_video_tasks"]:
        print(
            f"video: {video['mean_agent_visual_tokens']:.0f} visual tokens per task in "
            f"context vs {video['mean_uniform_1fps_tokens']:.0f} for uniform 1-fps sampling"
        )
    print(f"results: {Path(_OUT.value) / 'results.json'}")
    print(f"report:  {Path(_OUT.value) / 'report.html'}")


def run() -> None:
    """The `pyvision-eval` console command."""
    run_command(__name__, main)
