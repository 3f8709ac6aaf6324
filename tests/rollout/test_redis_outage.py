"""A Redis outage shorter than the queue's `outage_s` costs nothing but time: operations wait
and go on; a server restarted without persistence gets its consumer group back; one restarted
with AOF keeps every group. A longer outage fails with one line naming the server."""

import threading
import time

import pytest

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.rollout.queue import DeliveredGroups, QueueConfig, make_queue
from tests.rollout.minimal_groups import scored_group
from tests.rollout.redis_server import RedisServer


def open_queue(url, **overrides):
    settings = {
        "backend": "redis",
        "redis_url": url,
        "namespace": "outage",
        "max_staleness": None,
        "outage_s": 30.0,
    } | overrides
    return make_queue(QueueConfig(**settings))


def restart_after(server, delay_s):
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), server.restart()))
    thread.start()
    return thread


@pytest.mark.parametrize("persistent", [False, True])
def test_operations_wait_through_a_restart(tmp_path, persistent):
    server = RedisServer(tmp_path, persistent=persistent)
    try:
        trainer = open_queue(server.url, consumer="trainer")
        worker = open_queue(server.url)
        worker.put(b"before", version=0)
        server.kill()
        restarting = restart_after(server, 1.0)
        worker.put(b"during", version=0)  # waits for the server, then goes through
        restarting.join()
        payloads = [item.payload for item in trainer.get(max_groups=5, timeout=5)]
        # With AOF nothing is lost; without persistence the stream restarted empty, the
        # worker put "before" again as soon as its next put saw the new epoch, and the
        # trainer's consumer group came back on first use (NOGROUP).
        assert payloads == ([b"before", b"during"] if persistent else [b"during", b"before"])
        trainer.set_trainer_version(3)
        assert worker.trainer_version() == 3
        trainer.close()
        worker.close()
    finally:
        server.stop()


def test_the_trainers_dedup_waits_through_a_restart(tmp_path):
    server = RedisServer(tmp_path, persistent=True)
    try:
        dedup = DeliveredGroups.for_queue(QueueConfig(backend="redis", redis_url=server.url, outage_s=30.0))
        assert dedup.admit(scored_group("t0", 0))
        server.kill()
        restarting = restart_after(server, 1.0)
        dedup.commit(["t0#0"])  # the checkpoint's commit waits for the server
        restarting.join()
        server.kill()
        restarting = restart_after(server, 1.0)
        assert not DeliveredGroups.for_queue(QueueConfig(backend="redis", redis_url=server.url)).admit(
            scored_group("t0", 0)
        )  # asked during the outage, answered after it: committed, kept by the AOF
        restarting.join()
        dedup.close()
    finally:
        server.stop()


def test_a_restart_without_persistence_loses_no_group_and_trains_none_twice(tmp_path):
    """Groups in the stream at the restart are put again by their worker; groups the trainer
    took before it come back as repeats its dedup drops, also a restarted trainer's dedup."""
    server = RedisServer(tmp_path, persistent=False)
    try:
        trainer, worker = open_queue(server.url, consumer="trainer"), open_queue(server.url)
        config = QueueConfig(backend="redis", redis_url=server.url, namespace="outage", outage_s=30.0)
        dedup = DeliveredGroups.for_queue(config)

        def take(count):
            items = trainer.get(max_groups=count, timeout=5)
            trainer.ack([item.id for item in items])
            groups = [TrajectoryGroup.from_bytes(item.payload) for item in items]
            return [group.key for group in groups if dedup.admit(group)]

        for task in ("t0", "t1"):
            worker.put(scored_group(task, 0))
        assert take(2) == ["t0#0", "t1#0"]
        dedup.commit(["t0#0", "t1#0"])  # trained and checkpointed
        worker.put(scored_group("t2", 0))  # the worker sees t0 and t1 taken and forgets them
        worker.put(scored_group("t3", 0))  # still in the stream at the restart
        assert take(1) == ["t2#0"]  # taken, not yet checkpointed; the worker has not seen it taken
        server.kill()
        server.restart()
        worker.put(scored_group("t4", 0))  # a new epoch: t2 and t3 are put again
        assert trainer.stats().put_total == 3
        assert sorted(take(5)) == ["t3#0", "t4#0"]  # t2 again: a repeat
        dedup.commit(["t2#0", "t3#0", "t4#0"])  # writes back the keys the restart lost
        restarted = DeliveredGroups.for_queue(config)
        assert [restarted.admit(scored_group(task, 0)) for task in ("t0", "t1", "t2", "t5")] == [
            False,
            False,
            False,
            True,
        ]
        for closable in (trainer, worker, dedup, restarted):
            closable.close()
    finally:
        server.stop()


def test_after_a_restart_without_persistence_the_trainer_admits_groups_of_its_version(tmp_path):
    """The restart loses the trainer's version key too; the trainer's queue writes it back
    instead of reading 0 and dropping the groups put since (and those put again) as future."""
    server = RedisServer(tmp_path, persistent=False)
    try:
        trainer = open_queue(server.url, consumer="trainer", max_staleness=2)
        worker = open_queue(server.url, max_staleness=2)
        trainer.set_trainer_version(7)
        worker.put(scored_group("t0", 0, version=7))
        server.kill()
        server.restart()
        worker.put(scored_group("t1", 0, version=7))  # t0 is put again too
        assert trainer.trainer_version() == 7 and worker.trainer_version() == 7
        items = trainer.get(max_groups=4, timeout=5)
        trainer.ack([item.id for item in items])
        assert sorted(TrajectoryGroup.from_bytes(item.payload).key for item in items) == ["t0#0", "t1#0"]
        assert trainer.stats().dropped_future_total == 0
        for closable in (trainer, worker):
            closable.close()
    finally:
        server.stop()


def test_an_outage_longer_than_outage_s_fails_with_one_line_naming_the_server(tmp_path):
    server = RedisServer(tmp_path)
    queue = open_queue(server.url, outage_s=1.0)
    server.kill()
    started = time.monotonic()
    with pytest.raises(ConnectionError) as raised:
        queue.put(b"x", version=0)
    assert time.monotonic() - started >= 1.0
    first_line = str(raised.value).splitlines()[0]
    assert f"the Redis queue at {server.url} has been unreachable" in first_line and "outage_s=1" in first_line
