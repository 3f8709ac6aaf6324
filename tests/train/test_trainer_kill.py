"""Kill -9 of the trainer in external mode (Redis with AOF, a scripted rollout
worker process). The resumed trainer trains the groups of its lost steps from the spool
first, draws every step exactly once in its outputs, and never trains a group twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

from pyvision_jax.data.tasks import Task, write_tasks_jsonl
from tests.agent.turns import answer_turn
from tests.rollout.redis_server import RedisServer
from tests.train.tensorboard_events import read_scalars

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
from tests.tiny_random_cpu import get_config as tiny_cpu_config


def get_config():
    c = tiny_cpu_config()
    c.model.hf_dir = ""
    c.model.preset = "tiny"
    c.model.tokenizer = "tiny"
    c.data.train_files = ({tasks!r},)
    c.rl.group_size = 2
    c.rl.batch_groups = 1
    c.rl.oversample = 1.0
    c.rl.max_gen_rounds = 1
    c.rollout.mode = "external"
    c.rollout.engine = "scripted"
    c.rollout.script_file = {script!r}
    c.rollout.queue = "redis"
    c.rollout.redis_url = {redis_url!r}
    c.rollout.queue_namespace = "killrun"
    c.rollout.max_backlog = 2
    c.rollout.max_staleness = 1
    c.rollout.poll_s = 0.05
    c.rollout.wait_timeout_s = 300.0
    c.rollout.weights_dir = {weights!r}
    c.train.steps = {steps}
    c.train.checkpoint_every = 2
    c.train.micro_batch = 2
    c.train.length_buckets = (512,)
    c.train.sample_groups_per_step = 1
    c.sandbox.pool_size = 1
    return c
"""


def write_config(directory: Path, redis_url: str, steps: int) -> Path:
    tasks = []
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
    write_tasks_jsonl(directory / "tasks.jsonl", tasks)
    (directory / "script.json").write_text(json.dumps({"*": [answer_turn("A")]}))
    path = directory / f"config_{steps}.py"
    path.write_text(
        CONFIG.format(
            tasks=str(directory / "tasks.jsonl"),
            script=str(directory / "script.json"),
            redis_url=redis_url,
            weights=str(directory / "weights"),
            steps=steps,
        )
    )
    return path


def launch(script: str, args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "launch" / script), *args],
        cwd=ROOT,
        env=os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},  # its config imports tests.*
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def wait_for(
    predicate, what: str, processes: list[subprocess.Popen], logs: list[Path], limit_s: float = 400, poll_s: float = 0.3
):
    deadline = time.monotonic() + limit_s
    while not predicate():
        for process, log in zip(processes, logs):
            assert process.poll() in (None, 0), f"{log.name} exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            log.read_text()[-2000:] for log in logs
        )
        time.sleep(poll_s)


def sample_steps(workdir: Path) -> list[tuple[int, str]]:
    path = workdir / "trajectories.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [
        (r["step"], r["group"]["task"]["id"] + "#" + str(r["group"]["trajectories"][0]["rollout_index"] // 2))
        for r in records
    ]


def test_trainer_killed_mid_run_resumes_without_losing_or_repeating_a_group(tmp_path):
    (tmp_path / "redis_data").mkdir()
    server = RedisServer(tmp_path / "redis_data", persistent=True)
    workdir, fleet = tmp_path / "run", tmp_path / "fleet"
    config = write_config(tmp_path, server.url, steps=4)
    logs = [tmp_path / "worker.log", tmp_path / "trainer1.log", tmp_path / "trainer2.log"]
    worker = launch("rollout_worker.py", [f"--config={config}", f"--workdir={fleet}"], logs[0])
    trainer = launch("train.py", [f"--config={config}", f"--workdir={workdir}", "--progress=false"], logs[1])
    try:
        # step 2's asynchronous checkpoint is committed (orbax renames its temporary directory)
        # and step 3 is drawn, whose checkpoint (every 2) never comes. Whether or not step 2's
        # groups were acknowledged yet (at the next save), the checkpoint lists them, so the
        # restart releases them and replays only step 3's.
        wait_for(
            lambda: (workdir / "checkpoints" / "2").is_dir() and len(sample_steps(workdir)) >= 3,
            "step 3 and the checkpoint of step 2",
            [worker, trainer],
            logs[:2],
            poll_s=0.02,  # step 4 (which would acknowledge step 3's groups) must not finish first
        )
        trainer.send_signal(signal.SIGSTOP)  # frozen at once, then killed as a crash would
        trainer.send_signal(signal.SIGKILL)
        assert trainer.wait(timeout=30) == -9
        before = dict(sample_steps(workdir))
        spooled = sorted((workdir / "inflight").glob("*.group"))
        assert spooled, "the groups of the unsaved step stay spooled"
        trainer = launch("train.py", [f"--config={config}", f"--workdir={workdir}", "--progress=false"], logs[2])
        assert trainer.wait(timeout=400) == 0, logs[2].read_text()[-3000:]
    finally:
        for process in (worker, trainer):
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
        server.stop()
    after = sample_steps(workdir)
    assert [step for step, _ in after] == [1, 2, 3, 4]  # every step once, the torn tail gone
    assert len({key for _, key in after}) == 4  # no group trained twice
    assert dict(after)[3] == before[3]  # the lost step's group came back from the spool
    assert "resumed from" in logs[2].read_text() and "at step 2" in logs[2].read_text()
    tb_steps = [step for step, _ in read_scalars(str(workdir / "tb"))["filter/groups_drawn"]]
    assert tb_steps == [1, 2, 3, 4]
    assert not list((workdir / "inflight").glob("*.group"))  # all acknowledged at the end
