"""The `GroupSource` of a multi-process run: process 0 alone runs the real source (one
consumer of the queue, one engine), and every process gets the same groups from it.

Groups travel as bytes broadcast from process 0, so each process builds the identical host
batch and places its own part of it on the mesh. Params reach the real source as a host copy
gathered leaf by leaf (`multihost.gather_to_host`), only when it wants them
(`wants_params`: every step in process, only export steps for a fleet).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.train.multihost import agree, broadcast_bytes, gather_to_host, is_primary
from pyvision_jax.train.source import GroupSource


def encode_groups(groups: list[TrajectoryGroup]) -> bytes:
    return msgpack.packb([group.to_bytes() for group in groups])


def decode_groups(payload: bytes) -> list[TrajectoryGroup]:
    return [TrajectoryGroup.from_bytes(item) for item in msgpack.unpackb(payload)]


class BroadcastSource:
    """Wraps the source `build(host_params)` makes on process 0 (called on process 0 only, at
    `start`); the other processes hold none."""

    holds_params = False
    """The real source only ever sees host copies, so the train step may donate."""

    def __init__(self, build: Callable[[Any], GroupSource]):
        self._build = build
        self.inner: GroupSource | None = None

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        host = gather_to_host(params)
        if is_primary():
            self.inner = self._build(host)
            self.inner.start(host, version, state)

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        payload = encode_groups(self.inner.collect(count, stop)) if self.inner is not None else None
        return decode_groups(broadcast_bytes(payload))

    def wants_params(self, version: int, *, final: bool = False) -> bool:
        return agree(self.inner is not None and self.inner.wants_params(version, final=final))

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        host = gather_to_host(params) if self.wants_params(version, final=final) else None
        if self.inner is not None:
            self.inner.publish(host, version, final=final)

    def state(self) -> dict[str, Any]:
        return self.inner.state() if self.inner is not None else {}

    def receipt(self) -> Any:
        return self.inner.receipt() if self.inner is not None else None

    def acknowledge(self, receipt: Any) -> None:
        if self.inner is not None:
            self.inner.acknowledge(receipt)

    def stats(self) -> dict[str, float]:
        return self.inner.stats() if self.inner is not None else {}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
