"""The Redis Streams trajectory queue against a real redis-server (fixture in conftest.py)."""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from pyvision_jax.rollout.queue import (
    PublishedWeights,
    QueueFullError,
    RedisTrajectoryQueue,
    make_queue,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Group:
    """Stands in for TrajectoryGroup: bytes serialization plus a policy version."""

    def __init__(self, text, policy_version):
        self.text, self.policy_version = text, policy_version

    def to_bytes(self):
        return self.text.encode()


def open_queue(url, **settings):
    defaults = {"backend": "redis", "redis_url": url, "namespace": "test", "max_staleness": None,
                "claim_idle_ms": 200}
    return make_queue({**defaults, **settings})


def run_python(code, *args):
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": REPO_ROOT},
    )


def test_each_group_is_delivered_once_across_consumers_when_acknowledged(redis_url):
    producers = [open_queue(redis_url), open_queue(redis_url)]
    consumers = [open_queue(redis_url, consumer=name, claim_idle_ms=500) for name in "ab"]
    assert isinstance(consumers[0], RedisTrajectoryQueue)
    for number in range(30):
        producers[number % 2].put(Group(f"g{number}", number % 3))
    received = []
    while len(received) < 30:
        for consumer in consumers:
            items = consumer.get(max_groups=4, timeout=5)
            received.extend(items)
            assert consumer.ack([item.id for item in items]) == len(items)
    assert sorted(item.payload for item in received) == sorted(f"g{n}".encode() for n in range(30))
    assert all(item.version == int(item.payload[1:]) % 3 for item in received)

    time.sleep(0.7)  # past claim_idle_ms: acknowledged groups are never redelivered
    assert consumers[0].get(max_groups=4, timeout=0.3) == []
    stats = consumers[1].stats()
    assert (stats.put_total, stats.delivered_total, stats.acked_total) == (30, 30, 30)
    assert (stats.backlog, stats.pending, stats.reclaimed_total) == (0, 0, 0)
    for queue in producers + consumers:
        queue.close()


def test_groups_of_a_consumer_that_never_acks_are_reclaimed_by_another(redis_url):
    producer = open_queue(redis_url)
    ids = [producer.put(f"g{n}".encode(), version=0) for n in range(5)]
    dead = open_queue(redis_url, consumer="dead")
    taken = dead.get(max_groups=3, timeout=5)
    assert [item.id for item in taken] == ids[:3]

    early = open_queue(redis_url, consumer="early", claim_idle_ms=60_000)
    fresh = early.get(max_groups=10, timeout=0)  # not idle long enough yet: only new ones
    assert [item.id for item in fresh] == ids[3:]
    assert early.ack(ids[3:]) == 2

    survivor = open_queue(redis_url, consumer="survivor", claim_idle_ms=300)
    reclaimed = survivor.get(max_groups=10, timeout=10)
    assert [item.id for item in reclaimed] == ids[:3]
    assert [item.payload for item in reclaimed] == [b"g0", b"g1", b"g2"]
    assert survivor.ack(ids[:3]) == 3
    assert dead.ack([item.id for item in taken]) == 0  # a late ack of reclaimed work is a no-op
    stats = producer.stats()
    assert (stats.reclaimed_total, stats.delivered_total, stats.acked_total) == (3, 8, 5)
    assert stats.backlog == 0


def test_a_consumer_restarted_under_its_name_gets_its_unacknowledged_groups_back_at_once(
    redis_url,
):
    producer = open_queue(redis_url)
    ids = [producer.put(f"g{n}".encode(), version=0) for n in range(5)]
    before = open_queue(redis_url, consumer="trainer-0", claim_idle_ms=600_000)
    taken = before.get(max_groups=3, timeout=5)
    before.ack([taken[1].id])
    before.close()  # holds pending groups: it stays registered in the consumer group

    after = open_queue(redis_url, consumer="trainer-0", claim_idle_ms=600_000)
    assert [item.id for item in after.get(max_groups=1, timeout=0)] == [ids[0]]
    assert [item.id for item in after.get(max_groups=5, timeout=0)] == [ids[2]]
    assert [item.id for item in after.get(max_groups=5, timeout=0)] == ids[3:]
    assert after.get(max_groups=5, timeout=0.1) == []
    assert after.stats().reclaimed_total == 2


KILLED_CONSUMER = """
import sys, time
from pyvision_jax.rollout.queue import make_queue
queue = make_queue({"backend": "redis", "redis_url": sys.argv[1], "namespace": "test",
                    "consumer": "doomed", "max_staleness": None})
items = queue.get(max_groups=3, timeout=30)
print(" ".join(item.id for item in items), flush=True)
time.sleep(600)
"""


def test_groups_taken_by_a_killed_consumer_process_are_reclaimed(redis_url):
    queue = open_queue(redis_url, consumer="trainer", claim_idle_ms=500)
    ids = [queue.put(f"g{n}".encode(), version=n) for n in range(5)]
    doomed = run_python(KILLED_CONSUMER, redis_url)
    taken = doomed.stdout.readline().split()
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    assert taken == ids[:3]

    received = []
    deadline = time.monotonic() + 20
    while len(received) < 5 and time.monotonic() < deadline:
        items = queue.get(max_groups=5, timeout=1)
        received.extend(items)
        queue.ack([item.id for item in items])
    assert sorted(item.id for item in received) == sorted(ids)
    assert all(item.payload == f"g{item.version}".encode() for item in received)
    assert queue.stats().reclaimed_total == 3
    assert queue.stats().backlog == 0


def test_full_backlog_blocks_producers_until_the_trainer_acknowledges(redis_url):
    first, second = open_queue(redis_url, max_backlog=3), open_queue(redis_url, max_backlog=3)
    trainer = open_queue(redis_url, max_backlog=3, consumer="trainer")
    for number in range(3):
        first.put(f"g{number}".encode(), version=0)
    with pytest.raises(QueueFullError, match="max_backlog=3"):
        second.put(b"g3", version=0, timeout=0.1)
    [taken] = trainer.get(max_groups=1, timeout=5)
    with pytest.raises(QueueFullError):  # taken but not acknowledged still counts
        second.put(b"g3", version=0, timeout=0.1)

    put_done = threading.Event()
    blocked = threading.Thread(target=lambda: (second.put(b"g3", version=0), put_done.set()))
    blocked.start()
    assert not put_done.wait(0.3)
    trainer.ack([taken.id])
    blocked.join(timeout=30)
    assert put_done.is_set()
    stats = trainer.stats()
    assert (stats.backlog, stats.ready, stats.pending, stats.put_total) == (3, 3, 0, 4)
    payloads = [item.payload for item in trainer.get(max_groups=10, timeout=0)]
    assert payloads == [b"g1", b"g2", b"g3"]


def test_versions_and_weights_are_shared_and_stale_groups_counted(redis_url):
    trainer = open_queue(redis_url, consumer="trainer", max_staleness=2)
    worker = open_queue(redis_url)
    assert worker.trainer_version() == 0 and worker.latest_weights() is None
    trainer.set_trainer_version(5)
    trainer.publish_weights(5, "/shared/weights/5")
    assert worker.trainer_version() == 5
    assert worker.latest_weights() == PublishedWeights(5, "/shared/weights/5")

    for version in range(2, 7):
        worker.put(f"v{version}".encode(), version=version)
    items = trainer.get(max_groups=10, timeout=5)
    assert [item.version for item in items] == [3, 4, 5]  # 6: newer weights than the trainer's
    stats = worker.stats()
    assert (stats.dropped_stale_total, stats.dropped_future_total, stats.pending, stats.backlog) == (1, 1, 3, 3)
    assert trainer.ack([item.id for item in items]) == 3

    worker.put(b"v0", version=0)
    assert trainer.get(max_groups=10, timeout=0.2) == []
    assert worker.stats().dropped_stale_total == 2


def test_bad_ids_and_unreachable_servers_give_clear_errors(redis_url):
    queue = open_queue(redis_url)
    with pytest.raises(ValueError, match="not a Redis stream entry id: 'abc'"):
        queue.ack(["abc"])
    unused = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"] + 1
    with pytest.raises(ConnectionError, match="cannot reach the Redis queue"):
        open_queue(f"redis://127.0.0.1:{unused}/0")


PRODUCER = """
import sys
from pyvision_jax.rollout.queue import make_queue
url, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
queue = make_queue({"backend": "redis", "redis_url": url, "namespace": "test",
                    "max_backlog": 6, "max_staleness": None, "put_timeout_s": 60.0})
for number in range(count):
    queue.put(f"{tag}:{number}:{number % 4}".encode(), version=number % 4)
    print(number, flush=True)
"""


def test_two_producer_processes_one_killed_feed_a_consumer_exactly_once(redis_url):
    trainer = open_queue(redis_url, consumer="trainer", max_backlog=6, claim_idle_ms=60_000)
    processes = {"a": run_python(PRODUCER, redis_url, "a", 100_000),
                 "b": run_python(PRODUCER, redis_url, "b", 60)}
    confirmed = collections.defaultdict(list)

    def read_confirmations(tag):
        for line in processes[tag].stdout:
            confirmed[tag].append(int(line))
            if tag == "a" and len(confirmed[tag]) == 15:
                os.kill(processes[tag].pid, signal.SIGKILL)  # mid-run, maybe inside a put

    readers = [threading.Thread(target=read_confirmations, args=(tag,)) for tag in processes]
    for reader in readers:
        reader.start()

    received = collections.defaultdict(list)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        producing = any(process.poll() is None for process in processes.values())
        items = trainer.get(max_groups=5, timeout=0.1)
        for item in items:
            tag, number, version = item.payload.decode().split(":")
            assert item.version == int(version) == int(number) % 4
            received[tag].append(int(number))
        trainer.ack([item.id for item in items])
        if not producing and not items:
            break
    for reader in readers:
        reader.join(timeout=10)

    assert processes["a"].wait() == -signal.SIGKILL
    assert processes["b"].wait() == 0
    assert received["b"] == list(range(60))
    last_confirmed = confirmed["a"][-1]
    assert confirmed["a"] == list(range(last_confirmed + 1))
    # Every confirmed put arrives once; the put in flight at the kill may or may not have landed.
    assert sorted(received["a"]) in (list(range(last_confirmed + 1)),
                                     list(range(last_confirmed + 2)))
    stats = trainer.stats()
    assert stats.backlog == 0
    assert stats.put_total == stats.acked_total == len(received["a"]) + 60
