"""The in-process backend of the trajectory queue (semantics in `base.py`)."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from pyvision_jax.rollout.queue.base import (
    PublishedWeights,
    QueueStats,
    RawEntry,
    TrajectoryQueue,
    full_error,
    seconds_left,
)


class LocalTrajectoryQueue(TrajectoryQueue):
    """In-process, thread-safe queue: the embedded default (producers and trainer in threads).

    Items taken and never acknowledged stay pending (and in the backlog) until `close`: there
    is no other process to die, so there is no reclaim.
    """

    def __init__(
        self,
        *,
        max_backlog: int = 256,
        max_staleness: int | None = 1,
        put_timeout_s: float = 600.0,
        decode: Callable[[bytes], Any] | None = None,
    ) -> None:
        super().__init__(
            max_backlog=max_backlog, max_staleness=max_staleness, put_timeout_s=put_timeout_s, decode=decode
        )
        self._condition = threading.Condition()
        self._ready: collections.deque[RawEntry] = collections.deque()
        self._pending: dict[str, RawEntry] = {}
        self._next_id = 0
        self._trainer_version = 0
        self._weights: PublishedWeights | None = None
        self._counts: collections.Counter[str] = collections.Counter()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the trajectory queue is closed")

    def _backlog(self) -> int:
        return len(self._ready) + len(self._pending)

    def _wait_while(self, blocked: Callable[[], bool], deadline: float) -> bool:
        """Waits (holding the condition) while `blocked()`; False when `deadline` passes first."""
        self._check_open()
        while blocked():
            remaining = seconds_left(deadline)
            if remaining <= 0:
                return False
            self._condition.wait(None if math.isinf(remaining) else remaining)
            self._check_open()
        return True

    def _put(self, payload: bytes, version: int, deadline: float) -> str:
        start = time.monotonic()
        with self._condition:
            if not self._wait_while(lambda: self._backlog() >= self.max_backlog, deadline):
                raise full_error(self._backlog(), self.max_backlog, time.monotonic() - start)
            item_id = str(self._next_id)
            self._next_id += 1
            self._ready.append(RawEntry(item_id, version, payload))
            self._counts["put"] += 1
            self._condition.notify_all()
            return item_id

    def _take(self, max_groups: int, deadline: float) -> list[RawEntry]:
        with self._condition:
            if not self._wait_while(lambda: not self._ready, deadline):
                return []
            taken = [self._ready.popleft() for _ in range(min(max_groups, len(self._ready)))]
            for entry in taken:
                self._pending[entry.id] = entry
            self._counts["delivered"] += len(taken)
            return taken

    def _remove_pending(self, ids: Iterable[str], counter: str) -> int:
        with self._condition:
            removed = sum(self._pending.pop(str(item_id), None) is not None for item_id in ids)
            self._counts[counter] += removed
            if removed:
                self._condition.notify_all()
            return removed

    def _store_trainer_version(self, version: int) -> None:
        with self._condition:
            self._trainer_version = version

    def trainer_version(self) -> int:
        with self._condition:
            return self._trainer_version

    def _store_weights(self, weights: PublishedWeights) -> None:
        with self._condition:
            self._weights = weights

    def latest_weights(self) -> PublishedWeights | None:
        with self._condition:
            return self._weights

    def stats(self) -> QueueStats:
        with self._condition:
            return QueueStats.from_counters(ready=len(self._ready), pending=len(self._pending), counters=self._counts)

    def close(self) -> None:
        """Closes the queue; threads blocked in put/get raise RuntimeError."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
