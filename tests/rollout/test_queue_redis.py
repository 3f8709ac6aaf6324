"""What only the Redis Streams trajectory queue does, against a real redis-server (fixture in
conftest.py): reclaiming the groups of dead or restarted consumers, several processes, clear
errors (the shared contract: test_queue_contract.py; outages: test_redis_outage.py)."""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from pyvision_jax.rollout.queue import make_queue

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def open_queue(url, **settings):
    defaults = {"backend": "redis", "redis_url": url, "namespace": "test", "max_staleness": None, "claim_idle_ms": 200}
    return make_queue({**defaults, **settings})


def run_python(code, *args):
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=REPO_ROOT,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
    )


def test_acknowledged_groups_are_not_redelivered_after_claim_idle_ms(redis_url):
    producer = open_queue(redis_url)
    ids = [producer.put(f"g{n}".encode(), version=0) for n in range(5)]
    first = open_queue(redis_url, consumer="a", claim_idle_ms=500)
    taken = first.get(max_groups=5, timeout=5)
    assert [item.id for item in taken] == ids
    assert first.ack(ids) == 5
    time.sleep(0.7)  # past claim_idle_ms: an unacknowledged group would be reclaimed now
    second = open_queue(redis_url, consumer="b", claim_idle_ms=500)
    assert second.get(max_groups=5, timeout=0.3) == []
    assert first.get(max_groups=5, timeout=0.3) == []
    stats = producer.stats()
    assert (stats.put_total, stats.delivered_total, stats.acked_total) == (5, 5, 5)
    assert (stats.backlog, stats.pending, stats.reclaimed_total) == (0, 0, 0)
    for queue in (producer, first, second):
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


def test_a_consumer_restarted_under_its_name_gets_its_unacknowledged_groups_back_at_once(redis_url):
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
    processes = {"a": run_python(PRODUCER, redis_url, "a", 100_000), "b": run_python(PRODUCER, redis_url, "b", 60)}
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
    assert sorted(received["a"]) in (list(range(last_confirmed + 1)), list(range(last_confirmed + 2)))
    stats = trainer.stats()
    assert stats.backlog == 0
    assert stats.put_total == stats.acked_total == len(received["a"]) + 60
