"""Multi-host training: the trainer as two `jax.distributed` processes
on loopback with 2 CPU devices each trains exactly as one process with 4 devices, in sync
mode (tests/train/multihost_run.py: scripted engine, fake sandboxes) and in external mode
(launch/train.py with --config.train.coordinator_address etc., Redis, a scripted rollout
worker process): the same loss and grad norm at step 1 and to float32 reduction-order noise after it (the
processes sum gradients over gloo, one process in its own order; a 1-ulp difference in a
gradient becomes a difference in the Adam update), the same params to that noise, one TensorBoard stream and
one trajectory file written by process 0, weights exported once and equal to the checkpoint,
and a rerun that restores the checkpoint across both processes and goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from pyvision_jax.data.tasks import Task, write_tasks_jsonl
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.weights import latest_complete, load_weights
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer
from tests.agent.turns import answer_turn
from tests.rollout.redis_server import RedisServer, free_loopback_port
from tests.train.compilation_cache import COMPILATION_CACHE
from tests.train.tensorboard_events import read_scalars

ROOT = Path(__file__).resolve().parents[2]
PARAMS_ATOL = 2e-5  # lr 1e-3 moves params by ~1e-3 a step; summation order moves them by ~1e-6
EXTERNAL_CONFIG = """
from tests.tiny_random_cpu import get_config as tiny_cpu_config


def get_config():
    c = tiny_cpu_config()
    c.data.train_files = ({tasks!r},)
    c.rl.group_size, c.rl.batch_groups, c.rl.oversample, c.rl.max_gen_rounds = 2, 2, 1.0, 1
    c.rollout.mode, c.rollout.engine, c.rollout.script_file = "external", "scripted", {script!r}
    c.rollout.queue, c.rollout.redis_url = "redis", {redis_url!r}
    c.rollout.max_backlog, c.rollout.max_staleness, c.rollout.poll_s = 4, 10, 0.05
    c.rollout.wait_timeout_s = 300.0
    c.train.steps, c.train.lr, c.train.checkpoint_every, c.train.micro_batch = 2, 1e-3, 2, 4
    c.train.length_buckets, c.train.mesh_fsdp = (512,), -1
    c.sandbox.pool_size = 1
    return c
"""


def environment(devices: int) -> dict[str, str]:
    return os.environ | {
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_COMPILATION_CACHE_DIR": COMPILATION_CACHE,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
    }


def run_processes(command, processes: int, logs: Path, name: str) -> list[str]:
    """Runs `command(distributed args)` as `processes` processes (4 devices in all); returns
    their outputs after checking that every one succeeded."""
    coordinator = f"127.0.0.1:{free_loopback_port()}"
    paths = [logs / f"{name}-{i}.log" for i in range(processes)]
    running = [
        subprocess.Popen(
            command(coordinator if processes > 1 else "", processes, i),
            cwd=ROOT,
            env=environment(4 // processes),
            stdout=open(path, "w"),
            stderr=subprocess.STDOUT,
        )
        for i, path in enumerate(paths)
    ]
    try:
        codes = [process.wait(timeout=600) for process in running]
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    texts = [path.read_text() for path in paths]
    assert codes == [0] * processes, "\n".join(text[-3000:] for text in texts)
    return texts


def final_params(workdir: Path, step: int):
    template = init_train_state(init_params(ModelConfig.preset("tiny")), make_optimizer(OptimizerConfig()), seed=0)
    state, _ = TrainCheckpoints(workdir / "checkpoints", 2, 2).restore(template, step=step)
    return template.params, state.params


def check_same_training(one: Path, two: Path, steps: int) -> None:
    """Same losses and grad norms, same params, and process 0's outputs only, once."""
    first, second = read_scalars(str(one / "tb")), read_scalars(str(two / "tb"))
    for tag in ("actor/loss", "actor/grad_norm", "actor/loss_tokens", "filter/eligible"):
        assert [s for s, _ in first[tag]] == [s for s, _ in second[tag]] == list(range(1, steps + 1))
        assert second[tag][0] == first[tag][0], tag  # the same params and batch: the same numbers
        np.testing.assert_allclose([v for _, v in second[tag]], [v for _, v in first[tag]], rtol=1e-6, err_msg=tag)
    assert any(value != 0 for _, value in first["actor/loss"])
    assert len(list((two / "tb").glob("events.out.tfevents.*"))) == 1  # one stream
    records = [json.loads(line) for line in (two / "trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    initial, reference = final_params(one, steps)
    _, params = final_params(two, steps)
    moved = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(initial))
    )
    assert moved > 50 * PARAMS_ATOL
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=PARAMS_ATOL)


def sync_command(workdir: Path, steps: int):
    def command(coordinator: str, processes: int, index: int) -> list[str]:
        extra = [coordinator, str(processes), str(index)] if coordinator else []
        return [sys.executable, "-m", "tests.train.multihost_run", str(workdir), str(steps), *extra]

    return command


def test_two_processes_train_sync_mode_like_one_and_resume_together(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    run_processes(sync_command(one, 2), 1, tmp_path, "one")
    logs = run_processes(sync_command(two, 2), 2, tmp_path, "two")
    check_same_training(one, two, 2)
    assert all("FINISHED 0 2" in log for log in logs) and "step 2/2" not in logs[1]  # process 0 logs
    engine_version, engine_sum = logs[0].split("ENGINE-WEIGHTS ")[1].split()[:2]
    _, params = final_params(two, 2)
    assert int(engine_version) == 2 and "ENGINE-WEIGHTS" not in logs[1]
    assert "GATHER-BLOCKS equal" in logs[0] and "GATHER-BLOCKS" not in logs[1]
    assert np.isclose(
        float(engine_sum),
        sum(float(np.asarray(x, np.float64).sum()) for x in jax.tree.leaves(params)),
        rtol=1e-9,
        atol=1e-6,
    )  # process 0's engine got the params gathered from both
    logs = run_processes(sync_command(two, 3), 2, tmp_path, "resume")
    assert "resumed from" in logs[0] and "at step 2" in logs[0]
    assert all("FINISHED 2 3" in log for log in logs)
    records = [json.loads(line) for line in (two / "trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert TrainCheckpoints(two / "checkpoints", 2, 2).latest_step() == 3


def write_external_config(directory: Path, redis_url: str) -> Path:
    tasks, script = [], {}
    for i in range(6):
        image = directory / f"t{i}.png"
        Image.new("RGB", (56, 56), (40 * i, 90, 60)).save(image)
        tasks.append(
            Task(
                id=f"t{i}",
                question="Which colour?",
                answer="A",
                answer_type="multiple_choice",
                data_source="test",
                image_path=str(image),
                options=("red", "blue"),
            )
        )
        for rollout in range(4):  # rewards and lengths vary within every group
            script[f"t{i}/{rollout}"] = [
                answer_turn("A") if rollout % 2 == 0 else "Looking at every corner first.\n" + answer_turn("B")
            ]
    write_tasks_jsonl(directory / "tasks.jsonl", tasks)
    (directory / "script.json").write_text(json.dumps(script))
    path = directory / "external_config.py"
    path.write_text(
        EXTERNAL_CONFIG.format(
            tasks=str(directory / "tasks.jsonl"), script=str(directory / "script.json"), redis_url=redis_url
        )
    )
    return path


def external_run(config: Path, workdir: Path, namespace: str, processes: int, logs: Path) -> list[str]:
    """A trainer run of `processes` processes fed by one scripted rollout worker."""
    names = [f"--config.rollout.queue_namespace={namespace}", f"--config.rollout.weights_dir={workdir / 'weights'}"]
    worker = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "launch" / "rollout_worker.py"),
            f"--config={config}",
            f"--workdir={workdir.parent / (namespace + '-fleet')}",
            *names,
        ],
        cwd=ROOT,
        env=environment(1),
        stdout=open(logs / f"{namespace}-worker.log", "w"),
        stderr=subprocess.STDOUT,
    )

    def command(coordinator: str, count: int, index: int) -> list[str]:
        distributed = (
            [
                "--config.train.distributed=True",
                f"--config.train.coordinator_address={coordinator}",
                f"--config.train.num_processes={count}",
                f"--config.train.process_id={index}",
            ]
            if coordinator
            else []
        )
        return [
            sys.executable,
            str(ROOT / "launch" / "train.py"),
            f"--config={config}",
            f"--workdir={workdir}",
            "--progress=false",
            *names,
            *distributed,
        ]

    try:
        return run_processes(command, processes, logs, namespace)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_two_processes_train_external_mode_like_one_and_export_once(tmp_path):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    try:
        config = write_external_config(tmp_path, server.url)
        one, two = tmp_path / "one", tmp_path / "two"
        external_run(config, one, "one", 1, tmp_path)
        logs = external_run(config, two, "two", 2, tmp_path)
    finally:
        server.stop()
    check_same_training(one, two, 2)
    assert "step 2/2" in logs[0] and "step 2/2" not in logs[1]
    latest = latest_complete(two / "weights")
    assert latest is not None and latest.version == 2
    _, _, exported = load_weights(latest.path)  # published in bf16
    _, params = final_params(two, 2)
    for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(np.asarray(a).dtype))  # gathered from both
