"""The trajectory queue's contract (semantics in `rollout/queue/base.py`), run against every
backend: the in-process queue and the Redis Streams queue on the session's loopback
redis-server (conftest.py). Backend-specific behaviour is in test_queue_local.py,
test_queue_redis.py and test_redis_outage.py."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import time

import pytest

from pyvision_jax.rollout.queue import (
    BACKENDS,
    LocalTrajectoryQueue,
    PublishedWeights,
    QueueFullError,
    RedisTrajectoryQueue,
    TrajectoryQueue,
    make_queue,
)

QUEUE_CLASSES = {"local": LocalTrajectoryQueue, "redis": RedisTrajectoryQueue}
# An id that no put returns, in a form the backend's ack accepts.
UNKNOWN_IDS = {"local": "no-such-id", "redis": "0-1"}


@dataclasses.dataclass
class FakeGroup:
    """Stands in for TrajectoryGroup: bytes serialization plus a policy version."""

    text: str
    policy_version: int

    def to_bytes(self) -> bytes:
        return self.text.encode()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "FakeGroup":
        text = payload.decode()
        return cls(text, int(text.split(":")[1]))


class Backend:
    """Opens clients of fresh queues of one backend and closes them all at the end."""

    def __init__(self, name: str, redis_url: str | None) -> None:
        self.name = name
        self.unknown_id = UNKNOWN_IDS[name]
        self._redis_url = redis_url
        self._namespaces = itertools.count()
        self._opened: list[TrajectoryQueue] = []

    def open(self, clients: int, *, decode=None, **settings) -> list[TrajectoryQueue]:
        """`clients` handles on one fresh queue built by `make_queue` with the QueueConfig
        `settings` (max_staleness None unless given). Local: the same in-process object each
        time (producers and trainer share it); Redis: one connection each, under its own
        consumer name, as separate processes would open them."""
        config = {"backend": self.name, "max_staleness": None, **settings}
        if self.name == "local":
            queues = [make_queue(config, decode=decode)] * clients
        else:
            config.update(redis_url=self._redis_url, namespace=f"contract-{next(self._namespaces)}")
            queues = [make_queue(config, decode=decode) for _ in range(clients)]
        self._opened.extend(queues)
        return queues

    def close(self) -> None:
        for queue in {id(queue): queue for queue in self._opened}.values():
            queue.close()


@pytest.fixture(params=BACKENDS)
def backend(request):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    opened = Backend(request.param, redis_url)
    yield opened
    opened.close()


def test_threads_producing_and_consuming_deliver_each_group_once(backend):
    producers, per_producer, consumers = 3, 40, 2
    total = producers * per_producer
    queues = backend.open(producers + consumers + 1, max_backlog=4, decode=FakeGroup.from_bytes)
    producer_queues, consumer_queues, observer = queues[:producers], queues[producers:-1], queues[-1]
    assert isinstance(observer, QUEUE_CLASSES[backend.name])
    received, backlogs, acks = [], [], []
    lock, done = threading.Lock(), threading.Event()

    def produce(queue, index):
        for number in range(per_producer):
            queue.put(FakeGroup(f"p{index}-{number}:{number % 5}", number % 5), timeout=120)

    def consume(queue):
        while not done.is_set():
            items = queue.get(max_groups=3, timeout=0.05)
            acked = queue.ack([item.id for item in items])
            with lock:
                received.extend(items)
                backlogs.append(queue.stats().backlog)
                acks.append((acked, len(items)))

    threads = [threading.Thread(target=produce, args=(queue, i)) for i, queue in enumerate(producer_queues)]
    threads += [threading.Thread(target=consume, args=(queue,)) for queue in consumer_queues]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while observer.stats().acked_total < total and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()

    assert max(backlogs) <= 4
    assert all(acked == taken for acked, taken in acks)
    texts = sorted(item.obj.text for item in received)
    assert texts == sorted(f"p{i}-{n}:{n % 5}" for i in range(producers) for n in range(per_producer))
    assert all(item.version == item.obj.policy_version for item in received)
    assert observer.get(max_groups=4, timeout=0.3) == []  # acknowledged groups never come back
    stats = observer.stats()
    assert stats.put_total == stats.acked_total == stats.delivered_total == total
    assert (stats.ready, stats.pending, stats.backlog, stats.reclaimed_total) == (0, 0, 0, 0)


def test_full_backlog_blocks_put_until_an_ack_frees_room(backend):
    first, second, trainer = backend.open(3, max_backlog=3)
    for number in range(3):
        first.put(f"g{number}".encode(), version=0)
    with pytest.raises(QueueFullError, match="max_backlog=3"):
        second.put(b"g3", version=0, timeout=0.1)
    [taken] = trainer.get(max_groups=1, timeout=5)
    assert taken.payload == b"g0"
    with pytest.raises(QueueFullError):  # taken but not acknowledged still counts
        second.put(b"g3", version=0, timeout=0.1)

    put_done = threading.Event()
    blocked = threading.Thread(target=lambda: (second.put(b"g3", version=0), put_done.set()))
    blocked.start()
    assert not put_done.wait(0.3)
    assert trainer.ack([taken.id]) == 1
    blocked.join(timeout=30)
    assert put_done.is_set()
    stats = trainer.stats()
    assert (stats.backlog, stats.ready, stats.pending, stats.put_total) == (3, 3, 0, 4)
    assert [item.payload for item in trainer.get(max_groups=10, timeout=0)] == [b"g1", b"g2", b"g3"]


def test_stale_and_future_groups_are_dropped_acknowledged_and_counted(backend):
    """Future: made by weights newer than the trainer's (a trainer restarted from an older
    checkpoint discarded them)."""
    worker, trainer = backend.open(2, max_backlog=10, max_staleness=1)
    for version in range(5):
        worker.put(f"v{version}".encode(), version=version)
    trainer.set_trainer_version(3)
    items = trainer.get(max_groups=10, timeout=5)
    assert [item.version for item in items] == [2, 3]
    stats = worker.stats()
    assert (stats.dropped_stale_total, stats.dropped_future_total) == (2, 1)
    assert (stats.pending, stats.backlog, stats.acked_total) == (2, 2, 0)
    assert trainer.ack([item.id for item in items]) == 2

    worker.put(b"old", version=0)
    assert trainer.get(max_groups=1, timeout=0.2) == []  # only stale items: nothing admitted
    stats = worker.stats()
    assert (stats.dropped_stale_total, stats.acked_total, stats.backlog) == (3, 2, 0)


def test_trainer_version_and_published_weights_are_shared(backend):
    trainer, worker = backend.open(2)
    assert worker.trainer_version() == 0 and worker.latest_weights() is None
    trainer.set_trainer_version(4)
    trainer.publish_weights(4, "/ckpt/weights/4")
    assert worker.trainer_version() == 4
    assert worker.latest_weights() == PublishedWeights(4, "/ckpt/weights/4")
    with pytest.raises(ValueError, match="trainer version"):
        trainer.set_trainer_version(-2)
    with pytest.raises(ValueError, match="location"):
        trainer.publish_weights(5, "")
    assert worker.latest_weights() == PublishedWeights(4, "/ckpt/weights/4")


def test_ack_counts_only_pending_items(backend):
    [queue] = backend.open(1)
    first = queue.put(b"first", version=0)
    second = queue.put(b"second", version=0)
    [item] = queue.get(max_groups=1, timeout=0)
    assert item.id == first
    assert queue.ack([second, backend.unknown_id]) == 0  # not delivered yet: stays in the queue
    assert queue.ack([first]) == 1
    assert queue.ack([first]) == 0
    assert [item.payload for item in queue.get(max_groups=5, timeout=0)] == [b"second"]
    stats = queue.stats()
    assert (stats.acked_total, stats.delivered_total, stats.pending) == (1, 2, 1)


def test_get_waits_for_a_put_from_another_thread(backend):
    producer, consumer = backend.open(2)
    assert consumer.get(max_groups=2, timeout=0) == []
    timer = threading.Timer(0.1, lambda: producer.put(b"late", version=0))
    timer.start()
    items = consumer.get(max_groups=2, timeout=30)
    timer.join()
    assert [item.payload for item in items] == [b"late"]


def test_put_accepts_bytes_with_version_or_versioned_objects(backend):
    [queue] = backend.open(1, decode=FakeGroup.from_bytes)
    queue.put(FakeGroup("g:7", 7))
    queue.put(b"raw:3", version=3)
    first, second = queue.get(max_groups=2, timeout=0)
    assert (first.version, first.payload, first.obj) == (7, b"g:7", FakeGroup("g:7", 7))
    assert (second.version, second.obj) == (3, FakeGroup("raw:3", 3))

    with pytest.raises(TypeError, match="needs version="):
        queue.put(b"x")
    with pytest.raises(TypeError, match="policy_version"):
        queue.put(FakeGroup("g:1", 1), version=1)
    with pytest.raises(TypeError, match="to_bytes"):
        queue.put("a string")
    with pytest.raises(ValueError, match="FakeGroup.policy_version.*-1"):
        queue.put(FakeGroup("g:-1", -1))
    with pytest.raises(ValueError, match="version must be a non-negative integer"):
        queue.put(b"x", version=True)
    with pytest.raises(ValueError, match="max_groups"):
        queue.get(max_groups=0)
    assert queue.stats().put_total == 2  # the rejected puts enqueued nothing


def test_decode_failure_names_the_item(backend):
    [queue] = backend.open(1, decode=FakeGroup.from_bytes)
    item_id = queue.put(b"no version here", version=0)
    with pytest.raises(ValueError, match=f"queue item {re.escape(item_id)} \\(version 0"):
        queue.get(timeout=0)
