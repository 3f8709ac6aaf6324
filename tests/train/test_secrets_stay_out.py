"""Secrets stay out of everything a run writes: a fleet run (trainer in external mode and a
rollout worker over Redis with ACL users, an LLM judge behind an API key) and an evaluation of
its checkpoint, with the queue passwords and the judge's key planted in environment variables
and files; none of them appears in any file under the run's directories or in any output.
Also the one-line refusals of a secret put where it would be written down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from pyvision_jax.data.tasks import Task, write_tasks_jsonl
from pyvision_jax.wiring.credentials import judge_api_key, queue_password
from tests.agent.turns import answer_turn
from tests.grading.stub_judge import running_stub
from tests.rollout.redis_server import RedisServer
from tests.rollout.test_queue_credentials import PASSWORDS, acl_lines
from tests.tiny_random_cpu import get_config as tiny_cpu_config

ROOT = Path(__file__).resolve().parents[2]
JUDGE_KEY = "sk-judge-planted-5d81e0"

CONFIG = """
from tests.tiny_random_cpu import get_config as tiny_cpu_config


def get_config():
    c = tiny_cpu_config()
    c.model.hf_dir, c.model.preset = "", "tiny"
    c.data.train_files = ({tasks!r},)
    c.rl.group_size, c.rl.batch_groups, c.rl.oversample, c.rl.max_gen_rounds = 2, 1, 1.0, 1
    c.rollout.mode = "external"
    c.rollout.engine = "scripted"
    c.rollout.script_file = {script!r}
    c.rollout.queue = "redis"
    c.rollout.redis_url = "redis://" + {user!r} + "@127.0.0.1:{port}/0"
    c.rollout.redis_password_env = "PYVISION_QUEUE_PASSWORD"
    c.rollout.max_backlog = 2
    c.rollout.max_staleness = 1
    c.rollout.poll_s = 0.05
    c.rollout.max_epochs = 1
    c.rollout.wait_timeout_s = 300.0
    c.rollout.weights_dir = {weights!r}
    c.grading.routes = (("*", "judge"),)
    c.grading.judge_url = {judge_url!r}
    c.grading.judge_api_key_file = {key_file!r}
    c.train.steps = 2
    c.train.checkpoint_every = 1
    c.train.micro_batch = 2
    c.train.length_buckets = (512,)
    c.sandbox.pool_size = 1
    return c
"""


def write_inputs(directory: Path, port: int, judge_url: str) -> dict[str, Path]:
    tasks = []
    for i in range(4):
        Image.new("RGB", (56, 56), (50 * i, 90, 60)).save(directory / f"t{i}.png")
        tasks.append(Task(f"t{i}", "Which colour?", "red", "text", "test", image_path=str(directory / f"t{i}.png")))
    write_tasks_jsonl(directory / "tasks.jsonl", tasks)
    (directory / "script.json").write_text(json.dumps({"*": [answer_turn("red")]}))
    secrets = directory / "secrets"
    secrets.mkdir()
    (secrets / "judge_key").write_text(JUDGE_KEY + "\n")
    configs = {}
    for user in ("trainer", "worker"):
        configs[user] = directory / f"{user}_config.py"
        configs[user].write_text(
            CONFIG.format(
                tasks=str(directory / "tasks.jsonl"),
                script=str(directory / "script.json"),
                user=user,
                port=port,
                weights=str(directory / "weights"),
                judge_url=judge_url,
                key_file=str(secrets / "judge_key"),
            )
        )
    return configs


def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "launch" / script), *args]


def env(user: str) -> dict[str, str]:
    return os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "PYVISION_QUEUE_PASSWORD": PASSWORDS[user]}


def test_planted_secrets_appear_in_no_output_of_a_fleet_run_and_its_evaluation(tmp_path):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis", conf_lines=acl_lines(), auth=("trainer", PASSWORDS["trainer"]))
    outputs = []
    try:
        with running_stub() as judge:
            judge.api_key = JUDGE_KEY
            configs = write_inputs(tmp_path, server.port, judge.url)
            worker = subprocess.Popen(
                command("rollout_worker.py", f"--config={configs['worker']}", f"--workdir={tmp_path / 'fleet'}"),
                cwd=ROOT,
                env=env("worker"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            trained = subprocess.run(
                command(
                    "train.py", f"--config={configs['trainer']}", f"--workdir={tmp_path / 'run'}", "--progress=false"
                ),
                cwd=ROOT,
                env=env("trainer"),
                capture_output=True,
                text=True,
                timeout=900,
            )
            worker_output, _ = worker.communicate(timeout=300)
            evaluated = subprocess.run(
                command(
                    "eval.py",
                    f"--config={configs['trainer']}",
                    f"--checkpoint={tmp_path / 'run'}",
                    f"--data={tmp_path / 'tasks.jsonl'}",
                    f"--out={tmp_path / 'eval'}",
                    "--k=1",
                    "--progress=false",
                    "--config.rollout.engine=jax",
                    "--config.eval.max_new_tokens_per_turn=8",
                ),
                cwd=ROOT,
                env=env("trainer"),
                capture_output=True,
                text=True,
                timeout=600,
            )
            outputs = [trained.stdout, trained.stderr, worker_output, evaluated.stdout, evaluated.stderr]
            assert trained.returncode == 0, trained.stderr[-3000:]
            assert worker.returncode == 0, worker_output[-3000:]
            assert evaluated.returncode == 0, evaluated.stderr[-3000:]
            assert judge.requests and {r["authorization"] for r in judge.requests} == {f"Bearer {JUDGE_KEY}"}
    finally:
        server.stop()
    config_json = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config_json["rollout"]["redis_password_env"] == "PYVISION_QUEUE_PASSWORD"  # where, not what
    written = [
        path
        for path in tmp_path.rglob("*")
        if path.is_file() and path.parent.name not in ("secrets", "redis") and "jax_cache" not in path.parts
    ]
    assert any(path.name == "report.html" for path in written) and any(
        path.suffix == ".tfevents" or "tfevents" in path.name for path in written
    )
    secrets = [JUDGE_KEY, *PASSWORDS.values()]
    for path in written:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"a planted secret is in {path}"
    for text in outputs:
        for secret in secrets:
            assert secret not in text


def test_a_password_in_the_queue_url_is_refused_without_showing_it():
    config = tiny_cpu_config()
    config.rollout.redis_url = "redis://worker:hunter2-planted@queue-host:6379/0"
    with pytest.raises(ValueError) as raised:
        queue_password(config)
    assert "hunter2-planted" not in str(raised.value)
    assert "redis://worker:***@queue-host:6379/0 carries a password" in str(raised.value)


def test_a_named_secret_that_is_missing_is_named_in_one_line(tmp_path, monkeypatch):
    config = tiny_cpu_config()
    monkeypatch.delenv("PYVISION_TEST_UNSET", raising=False)
    config.rollout.redis_password_env = "PYVISION_TEST_UNSET"
    with pytest.raises(ValueError, match="redis_password_env='PYVISION_TEST_UNSET': the environment variable"):
        queue_password(config)
    config.rollout.redis_password_file = str(tmp_path / "absent")
    with pytest.raises(ValueError, match="both set"):
        queue_password(config)
    config.rollout.redis_password_env = ""
    with pytest.raises(ValueError, match=r"redis_password_file=.*absent.*cannot read it \(No such file"):
        queue_password(config)
    (tmp_path / "key").write_text("sk-file-key\nignored\n")
    config.grading.judge_api_key_file = str(tmp_path / "key")
    assert judge_api_key(config) == "sk-file-key"
    monkeypatch.setenv("PYVISION_TEST_KEY", "sk-env-key")
    config.grading.judge_api_key_file, config.grading.judge_api_key_env = "", "PYVISION_TEST_KEY"
    assert judge_api_key(config) == "sk-env-key"
