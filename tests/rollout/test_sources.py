"""Version accounting of the queue-backed sources: staleness is judged against the newest
weights delivered to the generators, so the trainer's own bookkeeping (steps without an
export, the export itself, the reload) never makes a group stale."""

import threading

import jax
import numpy as np

from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.rollout.sources import FleetSource
from pyvision_jax.rollout.weights import WeightsInbox, WeightsPublisher
from tests.rollout.minimal_groups import scored_group


def zeros(config):
    return jax.tree.map(lambda s: np.zeros(s.shape, np.float32), jax.eval_shape(lambda: init_params(config)))


def test_fleet_judges_staleness_by_the_newest_announced_weights(tmp_path):
    config = ModelConfig.preset("tiny")
    params = zeros(config)
    queue = LocalTrajectoryQueue(max_backlog=8, max_staleness=0)
    source = FleetSource(
        queue,
        WeightsPublisher(tmp_path, config, queue=queue),
        DeliveredGroups(None, "t"),
        publish_every=2,
        wait_timeout_s=5,
    )
    source.start(params, 0, {})
    source.sync.flush()
    stop = threading.Event()
    assert not source.wants_params(1)
    source.publish(None, 1)  # a step without an export: version 0 is still the newest weights
    queue.put(scored_group("a", 0, version=0))
    assert [g.key for g in source.collect(1, stop)] == [scored_group("a", 0).key]
    assert queue.trainer_version() == 0 and source.stats()["stale_dropped"] == 0
    source.publish(params, 2)
    source.sync.flush()
    assert queue.trainer_version() == 2 and queue.latest_weights().version == 2
    queue.put(scored_group("b", 0, version=0))  # made from weights two versions behind the newest
    queue.put(scored_group("c", 0, version=2))
    assert [g.task.id for g in source.collect(1, stop)] == ["c"]
    assert source.stats()["stale_dropped"] == 1


def test_inbox_moves_the_version_on_when_the_thread_loads_the_offer():
    loaded = []

    class Engine:
        version = 0

        def update_weights(self, weights, version):
            self.version = version

    queue = LocalTrajectoryQueue(max_backlog=8, max_staleness=0)
    inbox = WeightsInbox(Engine(), on_loaded=lambda v: (loaded.append(v), queue.set_trainer_version(v)))
    inbox.offer("params", 3)
    queue.put(scored_group("a", 0, version=0))  # the thread's batch in flight at the offer
    assert queue.trainer_version() == 0 and len(queue.get(max_groups=1, timeout=0.1)) == 1
    assert inbox.poll() == 3 and loaded == [3] and queue.trainer_version() == 3
