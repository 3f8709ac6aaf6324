"""The in-process trajectory queue, and the put/get API shared by every backend."""

import dataclasses
import threading
import time

import ml_collections
import pytest

from pyvision_jax.rollout.queue import (
    LocalTrajectoryQueue,
    PublishedWeights,
    QueueConfig,
    QueueFullError,
    make_queue,
)


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


def test_threads_producing_and_consuming_deliver_each_group_once():
    queue = LocalTrajectoryQueue(max_backlog=4, max_staleness=None, decode=FakeGroup.from_bytes)
    producers, per_producer, consumers = 3, 40, 2
    total = producers * per_producer
    received, backlogs = [], []
    lock, done = threading.Lock(), threading.Event()

    def produce(index):
        for number in range(per_producer):
            queue.put(FakeGroup(f"p{index}-{number}:{number % 5}", number % 5), timeout=30)

    def consume():
        while not done.is_set():
            items = queue.get(max_groups=3, timeout=0.05)
            with lock:
                received.extend(items)
                backlogs.append(queue.stats().backlog)
            queue.ack([item.id for item in items])

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    threads += [threading.Thread(target=consume) for _ in range(consumers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while queue.stats().acked_total < total and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()

    assert max(backlogs) <= 4
    texts = sorted(item.obj.text for item in received)
    assert texts == sorted(
        f"p{i}-{n}:{n % 5}" for i in range(producers) for n in range(per_producer)
    )
    assert all(item.version == item.obj.policy_version for item in received)
    stats = queue.stats()
    assert stats.put_total == stats.acked_total == stats.delivered_total == total
    assert (stats.ready, stats.pending, stats.backlog) == (0, 0, 0)


def test_full_backlog_blocks_put_until_an_ack_frees_room():
    queue = LocalTrajectoryQueue(max_backlog=2, max_staleness=None)
    queue.put(b"a", version=0)
    queue.put(b"b", version=0)
    with pytest.raises(QueueFullError, match="max_backlog=2"):
        queue.put(b"c", version=0, timeout=0.05)

    [taken] = queue.get(max_groups=1, timeout=0)
    with pytest.raises(QueueFullError):  # taken but not acknowledged still counts
        queue.put(b"c", version=0, timeout=0.05)

    put_done = threading.Event()
    blocked = threading.Thread(target=lambda: (queue.put(b"c", version=0), put_done.set()))
    blocked.start()
    assert not put_done.wait(0.2)
    assert queue.ack([taken.id]) == 1
    blocked.join(timeout=30)
    assert put_done.is_set()
    assert [item.payload for item in queue.get(max_groups=5, timeout=0)] == [b"b", b"c"]
    assert queue.stats().put_total == 3


def test_stale_and_future_groups_are_dropped_acknowledged_and_counted():
    """Future: made by weights newer than the trainer's (a trainer restarted from an older
    checkpoint discarded them)."""
    queue = LocalTrajectoryQueue(max_backlog=10, max_staleness=1)
    for version in range(5):
        queue.put(f"v{version}".encode(), version=version)
    queue.set_trainer_version(3)
    items = queue.get(max_groups=10, timeout=0)
    assert [item.version for item in items] == [2, 3]
    stats = queue.stats()
    assert (stats.dropped_stale_total, stats.dropped_future_total) == (2, 1)
    assert (stats.pending, stats.backlog, stats.acked_total) == (2, 2, 0)

    queue.put(b"old", version=0)
    assert queue.get(max_groups=1, timeout=0.05) == []  # only stale items: nothing admitted
    assert queue.stats().dropped_stale_total == 3


def test_ack_counts_only_pending_items():
    queue = LocalTrajectoryQueue(max_backlog=10)
    first = queue.put(b"first", version=0)
    second = queue.put(b"second", version=0)
    [item] = queue.get(max_groups=1, timeout=0)
    assert item.id == first
    assert queue.ack([second, "no-such-id"]) == 0  # not delivered yet: stays in the queue
    assert queue.ack([first]) == 1
    assert queue.ack([first]) == 0
    assert [item.payload for item in queue.get(max_groups=5, timeout=0)] == [b"second"]
    stats = queue.stats()
    assert (stats.acked_total, stats.delivered_total, stats.pending) == (1, 2, 1)


def test_get_waits_for_a_put_from_another_thread():
    queue = LocalTrajectoryQueue()
    assert queue.get(max_groups=2, timeout=0) == []
    timer = threading.Timer(0.1, lambda: queue.put(b"late", version=0))
    timer.start()
    items = queue.get(max_groups=2, timeout=30)
    timer.join()
    assert [item.payload for item in items] == [b"late"]


def test_close_wakes_blocked_consumers():
    queue = LocalTrajectoryQueue()
    errors = []

    def consume():
        try:
            queue.get(timeout=None)
        except RuntimeError as error:
            errors.append(error)

    reader = threading.Thread(target=consume)
    reader.start()
    queue.close()
    reader.join(timeout=30)
    assert len(errors) == 1 and "closed" in str(errors[0])


def test_put_accepts_bytes_with_version_or_versioned_objects():
    queue = LocalTrajectoryQueue(max_staleness=None, decode=FakeGroup.from_bytes)
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


def test_decode_failure_names_the_item():
    queue = LocalTrajectoryQueue(decode=FakeGroup.from_bytes)
    item_id = queue.put(b"no version here", version=0)
    with pytest.raises(ValueError, match=f"queue item {item_id} \\(version 0"):
        queue.get(timeout=0)


def test_trainer_version_and_published_weights():
    queue = LocalTrajectoryQueue()
    assert queue.trainer_version() == 0 and queue.latest_weights() is None
    queue.set_trainer_version(4)
    queue.publish_weights(4, "/ckpt/weights/4")
    assert queue.trainer_version() == 4
    assert queue.latest_weights() == PublishedWeights(4, "/ckpt/weights/4")
    with pytest.raises(ValueError, match="trainer version"):
        queue.set_trainer_version(-2)
    with pytest.raises(ValueError, match="location"):
        queue.publish_weights(5, "")


def test_make_queue_from_dataclass_dict_and_configdict():
    queue = make_queue(QueueConfig(max_backlog=3, max_staleness=None))
    assert isinstance(queue, LocalTrajectoryQueue)
    assert (queue.max_backlog, queue.max_staleness) == (3, None)
    config = ml_collections.ConfigDict({"backend": "local", "max_backlog": 5, "max_staleness": 2})
    queue = make_queue(config, decode=FakeGroup.from_bytes)
    assert (queue.max_backlog, queue.max_staleness) == (5, 2)
    queue.set_trainer_version(2)
    queue.put(FakeGroup("g:2", 2))
    assert queue.get(timeout=0)[0].obj == FakeGroup("g:2", 2)

    with pytest.raises(ValueError, match=r"unknown queue config keys \['max_backlg'\]"):
        make_queue({"max_backlg": 3})
    with pytest.raises(ValueError, match="queue.backend"):
        make_queue({"backend": "kafka"})
    with pytest.raises(ValueError, match="queue.max_backlog"):
        make_queue({"max_backlog": 0})
    with pytest.raises(ValueError, match="queue.max_staleness"):
        make_queue({"max_staleness": -1})
