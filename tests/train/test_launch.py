"""launch/train.py end to end on the embedded default (tiny model, JAX engine in process,
real sandboxes, synthetic tasks), then SIGTERM during a resumed run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer
from tests.train.compilation_cache import COMPILATION_CACHE
from tests.train.tensorboard_events import read_scalars

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--config.model.hf_dir=",
    "--config.model.preset=tiny",
    "--config.rl.group_size=2",
    "--config.rl.batch_groups=1",
    "--config.rl.max_gen_rounds=1",
    "--config.episode.max_new_tokens_per_turn=8",
    "--config.data.synthetic_per_kind=1",
    "--config.sandbox.pool_size=1",
    "--config.train.checkpoint_every=1",
    "--config.train.length_buckets=512",
    "--config.rollout.length_buckets=512,1024",
    "--progress=false",
]


def launch(workdir, *args):
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )
    return [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        "--config",
        str(ROOT / "tests" / "tiny_random_cpu.py"),
        f"--workdir={workdir}",
        *SMALL,
        *args,
    ], env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("run")


def test_two_steps_write_checkpoints_metrics_samples_and_config(workdir):
    command, env = launch(workdir, "--config.train.steps=2")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step 2/2" in result.stdout
    assert f"TensorBoard logs: {workdir / 'tb'}" in result.stdout
    assert f"checkpoints:      {workdir / 'checkpoints'}" in result.stdout
    assert TrainCheckpoints(workdir / "checkpoints", 1, 2).all_steps() == [1, 2]
    scalars = read_scalars(str(workdir / "tb"))
    expected = set(tags.TRAINER_SCALARS) | {tags.end_reason_tag(r.value) for r in EndReason}
    assert expected <= set(scalars), sorted(expected - set(scalars))
    assert all([s for s, _ in scalars[tag]] == [1, 2] for tag in expected)
    assert (workdir / "trajectories.jsonl").stat().st_size > 0
    assert '"group_size": 2' in (workdir / "config.json").read_text()
    for kind in ("visual_search", "counting", "video"):
        assert (workdir / "tasks" / f"{kind}.jsonl").is_file()


def test_sigterm_during_a_resumed_run_leaves_a_usable_checkpoint(workdir):
    command, env = launch(workdir, "--config.train.steps=40", "--config.train.checkpoint_every=100")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 600
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step 3/40"):
                process.send_signal(signal.SIGTERM)
                break
            assert time.monotonic() < deadline, "".join(lines[-30:])
        lines.extend(process.stdout)
        assert process.wait(timeout=300) == 0, "".join(lines[-40:])
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(lines)
    assert "resumed from" in output and "interrupted at step" in output
    checkpoints = TrainCheckpoints(workdir / "checkpoints", 100, 2)
    latest = checkpoints.latest_step()
    assert 3 <= latest < 40
    config = ModelConfig.preset("tiny")
    template = init_train_state(init_params(config), make_optimizer(OptimizerConfig()), seed=0)
    state, cursors = checkpoints.restore(template)
    assert int(state.step) == latest == cursors["step"]
    assert cursors["tasks_drawn"] == 2 * latest
    assert all(bool(jax.numpy.isfinite(x).all()) for x in jax.tree.leaves(state.params))
