"""Weight sync off the trainer's thread: snapshots that survive donation, a publisher thread
where a newer snapshot supersedes a pending one, errors surfaced to the trainer."""

import threading

import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.rollout.weights.background import BackgroundPublisher, snapshot


class GatedTransport:
    """Publishes when released; records (version, groups, values) of what it published."""

    def __init__(self):
        self.gate, self.started = threading.Event(), threading.Event()
        self.published = []

    def publish(self, version, params):
        self.started.set()
        self.gate.wait(timeout=30)
        if version < 0:
            raise OSError("disk full")
        self.published.append(
            (version, sorted(params), {g: float(np.asarray(v).ravel()[0]) for g, v in params.items()})
        )
        return f"/weights/v{version}"


def test_snapshot_casts_device_groups_into_new_buffers_and_keeps_host_groups():
    params = {"model": jnp.full((4, 4), 1.5, jnp.float32), "visual": jnp.ones((2,)), "host": np.zeros(3, np.float32)}
    snap = snapshot(params, ["model", "host"], "bfloat16")
    assert sorted(snap) == ["host", "model"] and snap["host"] is params["host"]
    assert snap["model"].dtype == jnp.bfloat16
    params["model"].delete()  # what donating the params to the next train step does
    np.testing.assert_array_equal(np.asarray(snap["model"], np.float32), np.full((4, 4), 1.5))


def test_a_newer_snapshot_supersedes_the_pending_one_and_keeps_its_frozen_groups():
    transport, announced = GatedTransport(), []
    publisher = BackgroundPublisher(transport, on_published=lambda v, where: announced.append((v, where)))
    publisher.submit(1, {"model": np.full(2, 1.0), "visual": np.full(2, 9.0)})
    assert transport.started.wait(timeout=30)  # version 1 is being written
    publisher.submit(2, {"model": np.full(2, 2.0), "visual": np.full(2, 9.0)})
    publisher.submit(3, {"model": np.full(2, 3.0)})  # supersedes 2, keeps its "visual"
    transport.gate.set()
    publisher.flush()
    assert [v for v, _, _ in transport.published] == [1, 3] and publisher.superseded == 1
    assert transport.published[1][1:] == (["model", "visual"], {"model": 3.0, "visual": 9.0})
    assert announced == [(1, "/weights/v1"), (3, "/weights/v3")]
    publisher.close()


def test_a_failed_publish_surfaces_in_the_trainer_thread():
    transport = GatedTransport()
    transport.gate.set()
    publisher = BackgroundPublisher(transport)
    publisher.submit(-1, {"model": np.zeros(1)})
    with pytest.raises(RuntimeError, match="publishing weights failed") as caught:
        publisher.flush()
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(RuntimeError):
        publisher.submit(2, {"model": np.zeros(1)})
    with pytest.raises(RuntimeError):
        publisher.close()
