"""Validation during training survives kill -9: a tiny run (configs/tiny_cpu.py, the packaged
shapes SFT model, with small overrides) validating every 2 steps is killed in the middle of
its step-2 validation and run again; TensorBoard, read back, holds the validation scalars of
steps 0, 2 and 4 exactly once each, and the step-2 evaluation kept the tasks it had finished."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from pyvision_jax.data import synthetic
from pyvision_jax.data.shape_tasks import DATA_SOURCE
from pyvision_jax.run_logs import metric_names as tags
from tests.train.tensorboard_events import read_scalars
from tests.train.test_trainer_kill import launch, wait_for

CONFIG = """
from configs.tiny_cpu import get_config as tiny_cpu_config


def get_config():
    c = tiny_cpu_config()
    c.data.synthetic_per_kind = 4
    c.data.val_files = ({val!r},)
    c.rl.batch_groups = 1
    c.rl.group_size = 2
    c.rl.oversample = 1.0
    c.rl.max_gen_rounds = 1
    c.train.steps = 4
    c.train.checkpoint_every = 3
    c.train.micro_batch = 2
    c.train.warmup_steps = 0
    c.episode.max_concurrent = 4
    c.sandbox.pool_size = 2
    c.eval.heldout_per_kind = 0
    c.eval.every_steps = 2
    c.eval.before_training = True
    c.eval.val_k = 1
    c.eval.tasks_per_batch = 1
    c.eval.max_tool_calls = 2
    return c
"""


def validation_lines(workdir: Path, step: int) -> int:
    path = workdir / "validation" / f"step_{step}" / "trajectories.jsonl"
    return len([line for line in path.read_text().splitlines() if line.endswith("}")]) if path.is_file() else 0


def test_a_run_killed_mid_validation_validates_each_step_once(tmp_path):
    val = synthetic.write_synthetic_task_file(tmp_path / "val", 12, seed=31, kinds=("shapes",))
    config = tmp_path / "config.py"
    config.write_text(CONFIG.format(val=str(val)))
    workdir = tmp_path / "run"
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    args = [f"--config={config}", f"--workdir={workdir}", "--progress=false"]
    trainer = launch("train.py", args, logs[0])
    try:
        wait_for(lambda: validation_lines(workdir, 2) >= 1, "the step-2 validation", [trainer], logs[:1], 900, 0.02)
        trainer.send_signal(signal.SIGSTOP)  # frozen at once, then killed as a crash would
        trainer.send_signal(signal.SIGKILL)
        assert trainer.wait(timeout=30) == -9
        done_before = validation_lines(workdir, 2)
        assert 1 <= done_before < 12 and not (workdir / "validation" / "step_2" / "scalars.json").exists()
        trainer = launch("train.py", args, logs[1])
        assert trainer.wait(timeout=900) == 0, logs[1].read_text()[-3000:]
    finally:
        if trainer.poll() is None:
            trainer.send_signal(signal.SIGKILL)
            trainer.wait()
    assert "resumed from" in logs[1].read_text() and "at step 2" in logs[1].read_text()
    scalars = read_scalars(str(workdir / "tb" / tags.VALIDATION_TB_DIR))
    for tag in (tags.VAL_ACCURACY, tags.val_accuracy_tag(DATA_SOURCE), tags.VAL_TOOL_CALLS, tags.VAL_RESPONSE_LENGTH):
        assert [step for step, _ in scalars[tag]] == [0, 2, 4], tag
    ended = [tag for tag in scalars if tag.startswith(tags.VAL_END_REASON_PREFIX)]
    assert ended and all(len({step for step, _ in scalars[tag]}) == len(scalars[tag]) for tag in ended)
    results = json.loads((workdir / "validation" / "step_2" / "results.json").read_text())
    assert results["complete"] and results["num_tasks_total"] == 12 and results["policy_version"] == 2
    assert results["num_tasks_skipped_as_finished"] == done_before
    assert validation_lines(workdir, 2) == 12
    training = read_scalars(str(workdir / "tb"))
    assert [step for step, _ in training[tags.REWARD_ACCURACY]] == [1, 2, 3, 4]
