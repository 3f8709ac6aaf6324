"""What only the in-process trajectory queue does: closing it wakes blocked threads, and
`make_queue` builds it from any config form (the shared contract: test_queue_contract.py)."""

import threading

import ml_collections
import pytest

from pyvision_jax.rollout.queue import LocalTrajectoryQueue, QueueConfig, make_queue


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


def test_make_queue_from_dataclass_dict_and_configdict():
    queue = make_queue(QueueConfig(max_backlog=3, max_staleness=None))
    assert isinstance(queue, LocalTrajectoryQueue)
    assert (queue.max_backlog, queue.max_staleness) == (3, None)
    config = ml_collections.ConfigDict({"backend": "local", "max_backlog": 5, "max_staleness": 2})
    queue = make_queue(config, decode=bytes.decode)
    assert (queue.max_backlog, queue.max_staleness) == (5, 2)
    queue.set_trainer_version(2)
    queue.put(b"g:2", version=2)
    [item] = queue.get(timeout=0)
    assert (item.version, item.obj) == (2, "g:2")

    with pytest.raises(ValueError, match=r"unknown queue config keys \['max_backlg'\]"):
        make_queue({"max_backlg": 3})
    with pytest.raises(ValueError, match="queue.backend"):
        make_queue({"backend": "kafka"})
    with pytest.raises(ValueError, match="queue.max_backlog"):
        make_queue({"max_backlog": 0})
    with pytest.raises(ValueError, match="queue.max_staleness"):
        make_queue({"max_staleness": -1})
