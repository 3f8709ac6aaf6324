"""Two launch/rollout_worker.py processes and a consumer over a real Redis.

The consumer plays the trainer. A placeholder item fills the queue's backlog (max 1) until
both workers have started, so neither can run ahead: the workers together are at most one
group ahead of what the consumer took. On the first group the consumer SIGKILLs the worker
that made it (mid-shard), publishes weights version 1, SIGTERMs the other one (which must
exit cleanly, mid-shard as well) and restarts both. It must receive every (task, epoch)
group exactly once after dropping repeats by key, with each group's version that of the
weights its worker had loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.data.tasks import Task, write_tasks_jsonl
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.queue import DeliveredGroups, RedisTrajectoryQueue
from pyvision_jax.rollout.weights import WeightsPublisher
from tests.agent.turns import answer_turn

ROOT = Path(__file__).resolve().parents[2]
NUM_TASKS, GROUP_SIZE, SEED = 12, 2, 0

CONFIG_TEMPLATE = """
from tests.tiny_random_cpu import get_config as tiny_cpu_config


def get_config():
    c = tiny_cpu_config()
    c.model.hf_dir = ""
    c.model.preset = "tiny"
    c.data.train_files = ({tasks!r},)
    c.rl.group_size = {group_size}
    c.rollout.engine = "scripted"
    c.rollout.script_file = {script!r}
    c.rollout.queue = "redis"
    c.rollout.redis_url = {redis_url!r}
    c.rollout.max_backlog = 1
    c.rollout.max_staleness = 0
    c.rollout.max_epochs = 1
    c.rollout.poll_s = 0.05
    c.sandbox.pool_size = 1
    return c
"""


def write_inputs(directory: Path, redis_url: str) -> tuple[Path, list[Task]]:
    tasks = []
    for i in range(NUM_TASKS):
        image = directory / f"t{i}.png"
        Image.new("RGB", (56, 56), (30 * i, 90, 60)).save(image)
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
    config = directory / "fleet_config.py"
    config.write_text(
        CONFIG_TEMPLATE.format(
            tasks=str(directory / "tasks.jsonl"),
            group_size=GROUP_SIZE,
            script=str(directory / "script.json"),
            redis_url=redis_url,
        )
    )
    return config, tasks


def start_worker(config: Path, index: int, workdir: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "launch" / "rollout_worker.py"),
            f"--config={config}",
            f"--worker-index={index}",
            "--num-workers=2",
            f"--workdir={workdir}",
        ],
        cwd=ROOT,
        env=os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},  # its config imports tests.*
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def test_two_workers_and_a_consumer_exactly_once_through_kill_and_term(redis_url, tmp_path):
    config, tasks = write_inputs(tmp_path, redis_url)
    shard_of = {TaskShard(tasks, SEED, i, 2).at(c).task.id: i for i in range(2) for c in range(NUM_TASKS // 2)}
    queue = RedisTrajectoryQueue(redis_url, max_backlog=1, max_staleness=None, claim_idle_ms=2000)
    queue.set_trainer_version(0)
    placeholder = queue.put(b"placeholder", version=0)  # the backlog is full until both start
    model_config = ModelConfig.preset("tiny")
    shapes = jax.eval_shape(lambda: init_params(model_config))
    publisher = WeightsPublisher(tmp_path / "weights", model_config, queue=queue)
    logs = [tmp_path / "worker0.log", tmp_path / "worker1.log"]
    workers = [start_worker(config, i, tmp_path / "fleet", logs[i]) for i in range(2)]
    delivered = DeliveredGroups(None, "pyvision")
    received: dict[str, TrajectoryGroup] = {}
    arrival: list[tuple[int, str, int]] = []  # (worker, key, version) in delivery order
    repeats = 0
    killed = terminated = False
    deadline = time.monotonic() + 420  # guards against a hang only
    try:
        while not all("starting at cursor" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(w.poll() is None for w in workers), [
                log.read_text()[-3000:] for log in logs
            ]
            time.sleep(0.2)
        [item] = queue.get(max_groups=1, timeout=10)
        assert item.id == placeholder and queue.ack([item.id]) == 1
        while len(received) < NUM_TASKS:
            assert time.monotonic() < deadline, f"received {sorted(received)} only"
            for worker, log in zip(workers, logs):
                assert worker.poll() in (None, 0), log.read_text()[-3000:]
            for item in queue.get(max_groups=1, timeout=1.0):
                queue.ack([item.id])
                group = TrajectoryGroup.from_bytes(item.payload)
                assert item.version == group.policy_version
                if not delivered.admit(group):
                    repeats += 1
                    continue
                delivered.commit([group.key])
                received[group.key] = group
                arrival.append((shard_of[group.task.id], group.key, item.version))
            if not killed and arrival:
                victim = arrival[0][0]  # its first group arrived: at most 2 of its 6 are put
                other = 1 - victim
                workers[victim].send_signal(signal.SIGKILL)
                assert workers[victim].wait(timeout=30) == -9
                killed = True
                queue.set_trainer_version(1)  # the trainer's step, then its weights
                publisher.publish(1, jax.tree.map(lambda s: np.full(s.shape, 0.5, np.float32), shapes))
                workers[other].send_signal(signal.SIGTERM)  # mid-shard too: at most 3 put
                assert workers[other].wait(timeout=120) == 0, logs[other].read_text()[-3000:]
                assert f"rollout worker {other}/2 stopped" in logs[other].read_text()
                terminated = True
                workers = [start_worker(config, i, tmp_path / "fleet", logs[i]) for i in range(2)]
        for worker, log in zip(workers, logs):
            assert worker.wait(timeout=180) == 0, log.read_text()[-3000:]
        assert queue.get(max_groups=10, timeout=0.5) == []  # nothing left over
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        queue.close()
    assert killed and terminated
    assert sorted(received) == sorted(f"{t.id}#0" for t in tasks)
    assert repeats <= 1  # only a kill between a put and its cursor write repeats a group
    for group in received.values():
        assert len(group) == GROUP_SIZE
        assert {turn.policy_version for t in group.trajectories for turn in t.turns} == {group.policy_version}
    for worker in range(2):
        versions = [v for w, _, v in arrival if w == worker]
        assert versions == sorted(versions) and versions[-1] == 1  # restarted on version 1
    for log, worker in zip(logs, range(2)):
        last_run = log.read_text().split(f"rollout worker {worker}/2")[-1]
        assert "finished" in last_run and "weights loaded [1]" in last_run
