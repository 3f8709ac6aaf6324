"""The queue with credentials: Redis started on loopback with the ACL users of docs/fleet.md
(read from that page, so the documented lines are the tested ones). A worker with a wrong
password is refused in one line; each role can do its part of the fleet's work and a worker
can neither read, acknowledge nor delete the trainer's stream state; the same over TLS."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from pyvision_jax.rollout.queue import DeliveredGroups, QueueAccessError, RedisTrajectoryQueue
from tests.rollout.minimal_groups import scored_group
from tests.rollout.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"trainer": "trainer-secret-7f3a", "worker": "worker-secret-91c2"}


def documented_conf(block_start: str) -> list[str]:
    """The lines of the ```conf block of docs/fleet.md that begins with `block_start`."""
    for block in re.findall(r"```conf\n(.*?)```", (ROOT / "docs" / "fleet.md").read_text(), re.S):
        if block.startswith(block_start):
            return block.strip().splitlines()
    raise AssertionError(f"docs/fleet.md has no conf block starting {block_start!r}")


def acl_lines() -> list[str]:
    lines = documented_conf("user default off")
    for role, password in PASSWORDS.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        lines = [line.replace(f"#{role.upper()}_SHA256", f"#{digest}") for line in lines]
    return lines


def url(server: RedisServer, user: str, scheme: str = "redis") -> str:
    return f"{scheme}://{user}@127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("acl"), conf_lines=acl_lines(), auth=("trainer", PASSWORDS["trainer"]))
    yield server
    server.stop()


def roles(server: RedisServer, scheme: str = "redis", ca_file: str = ""):
    trainer = RedisTrajectoryQueue(
        url(server, "trainer", scheme),
        password=PASSWORDS["trainer"],
        ca_file=ca_file,
        consumer="trainer",
        max_staleness=None,
    )
    worker = RedisTrajectoryQueue(
        url(server, "worker", scheme), password=PASSWORDS["worker"], ca_file=ca_file, max_staleness=None
    )
    return trainer, worker


def exercise(trainer: RedisTrajectoryQueue, worker: RedisTrajectoryQueue, dedup: DeliveredGroups) -> None:
    """The fleet's work, each part by its role."""
    worker.put(scored_group("t0", 0, version=0))  # before any consumer: the stream exists, no group yet
    trainer.set_trainer_version(1)
    trainer.publish_weights(1, "/shared/weights/v000001")
    assert worker.trainer_version() == 1 and worker.latest_weights().version == 1
    worker.put(scored_group("t1", 0, version=1))
    items = trainer.get(max_groups=2, timeout=5)
    assert len(items) == 2 and trainer.ack([item.id for item in items]) == 2
    dedup.commit(["t0#0", "t1#0"])
    assert trainer.stats().acked_total == 2


def test_each_role_does_its_part_and_a_worker_cannot_touch_the_trainers_state(acl_server):
    trainer, worker = roles(acl_server)
    dedup = DeliveredGroups(url(acl_server, "trainer"), "pyvision", password=PASSWORDS["trainer"])
    exercise(trainer, worker, dedup)
    worker.put(scored_group("t2", 0, version=1))
    [pending] = trainer.get(max_groups=1, timeout=5)  # an entry the trainer holds unacknowledged
    raw = redis.Redis(host="127.0.0.1", port=acl_server.port, username="worker", password=PASSWORDS["worker"])
    forbidden = [
        ("XRANGE", "pyvision:groups", "-", "+"),
        ("XREAD", "STREAMS", "pyvision:groups", "0"),
        ("XREADGROUP", "GROUP", "trainer", "w", "STREAMS", "pyvision:groups", ">"),
        ("XPENDING", "pyvision:groups", "trainer"),
        ("XINFO", "GROUPS", "pyvision:groups"),
        ("XACK", "pyvision:groups", "trainer", pending.id),
        ("XDEL", "pyvision:groups", pending.id),
        ("XTRIM", "pyvision:groups", "MAXLEN", "0"),
        ("XGROUP", "DESTROY", "pyvision:groups", "trainer"),
        ("XGROUP", "SETID", "pyvision:groups", "trainer", "$"),
        ("DEL", "pyvision:groups"),
        ("SMEMBERS", "pyvision:delivered"),
        ("DEL", "pyvision:delivered"),
        ("SET", "pyvision:trainer_version", "99"),
        ("HSET", "pyvision:weights", "location", "/tmp/evil"),
        ("EVAL", "return redis.call('XDEL', KEYS[1], ARGV[1])", "1", "pyvision:groups", pending.id),
        ("KEYS", "*"),
        ("FLUSHALL",),
        ("CONFIG", "GET", "*"),
    ]
    for command in forbidden:
        with pytest.raises(redis.ResponseError, match="NOPERM|No permissions|permission"):
            raw.execute_command(*command)
    assert trainer.ack([pending.id]) == 1  # the entry and the group are intact
    assert trainer.trainer_version() == 1 and trainer.stats().acked_total == 3
    with pytest.raises(QueueAccessError, match="no permissions"):
        worker.get(max_groups=1, timeout=0)  # through the queue too: one clear error
    raw.close()
    for queue in (trainer, worker):
        queue.close()
    dedup.close()


def test_a_worker_with_a_wrong_password_is_refused_in_one_line(acl_server, tmp_path):
    config = tmp_path / "worker_config.py"
    config.write_text(
        "from tests.tiny_random_cpu import get_config as tiny\n\n\ndef get_config():\n"
        "    c = tiny()\n    c.model.hf_dir, c.model.preset = '', 'tiny'\n"
        "    c.data.synthetic_per_kind = 1\n    c.rollout.engine = 'scripted'\n"
        f"    c.rollout.script_file = {str(tmp_path / 'script.json')!r}\n"
        f"    c.rollout.queue = 'redis'\n    c.rollout.redis_url = {url(acl_server, 'worker')!r}\n"
        "    c.rollout.redis_password_env = 'QUEUE_PASSWORD'\n    return c\n"
    )
    (tmp_path / "script.json").write_text('{"*": ["<answer>A</answer>"]}')
    wrong = "not-the-worker-password"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "launch" / "rollout_worker.py"),
            f"--config={config}",
            f"--workdir={tmp_path / 'w'}",
        ],
        cwd=ROOT,
        env=os.environ | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "QUEUE_PASSWORD": wrong},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0] == (
        f"pyvision-rollout-worker: error: the Redis queue at {url(acl_server, 'worker')} refused the "
        f"credentials: invalid username-password pair or user is disabled."
    )
    assert wrong not in done.stdout + done.stderr


def test_the_roles_over_tls(tmp_path):
    tls = tmp_path / "tls"
    tls.mkdir()
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(tls / "server.key"),
            "-out",
            str(tls / "server.crt"),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    conf = acl_lines() + [
        line.replace("/etc/redis/tls/ca.crt", str(tls / "server.crt")).replace("/etc/redis/tls", str(tls))
        for line in documented_conf("port 0")
    ]
    plain = RedisServer(tmp_path, conf_lines=acl_lines(), auth=("trainer", PASSWORDS["trainer"]))
    port = plain.port  # a free port for TLS: the documented `port 0` closes the plain one
    plain.stop()
    conf = [line.replace("tls-port 6379", f"tls-port {port}") for line in conf]
    server = subprocess.Popen(
        ["redis-server", "-", "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server.stdin.write("\n".join(conf) + "\n")
    server.stdin.close()
    try:
        tls_url = lambda user: f"rediss://{user}@127.0.0.1:{port}/0"  # noqa: E731
        for attempt in range(200):
            try:
                trainer = RedisTrajectoryQueue(
                    tls_url("trainer"),
                    password=PASSWORDS["trainer"],
                    ca_file=str(tls / "server.crt"),
                    consumer="trainer",
                    max_staleness=None,
                    outage_s=0,
                )
                break
            except ConnectionError:
                assert server.poll() is None and attempt < 199
                subprocess.run(["sleep", "0.1"])
        worker = RedisTrajectoryQueue(
            tls_url("worker"), password=PASSWORDS["worker"], ca_file=str(tls / "server.crt"), max_staleness=None
        )
        dedup = DeliveredGroups(
            tls_url("trainer"), "pyvision", password=PASSWORDS["trainer"], ca_file=str(tls / "server.crt")
        )
        exercise(trainer, worker, dedup)
        with pytest.raises(ConnectionError):  # plain text to the TLS port
            RedisTrajectoryQueue(f"redis://worker@127.0.0.1:{port}/0", password=PASSWORDS["worker"], outage_s=0)
        for closable in (trainer, worker, dedup):
            closable.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
