"""Weights handed over inside one process: the params pytree goes to the engines as it is,
nothing touches the disk."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from pyvision_jax.agent.engine import Engine
from pyvision_jax.rollout.queue import checked_version


def update_engines(engines: Iterable[Engine], weights: Any, version: int) -> None:
    """In-process publishing: every engine takes the params pytree (no copy to disk)."""
    version = checked_version(version, "weights version")
    for engine in engines:
        engine.update_weights(weights, version)


class WeightsInbox:
    """In-process hand-over to a background rollout thread: the trainer `offer`s params, the
    thread's loop `poll`s between batches and loads the newest offer into its engine, then
    calls `on_loaded(version)` (the queue's version: what staleness is judged against)."""

    def __init__(self, engine: Engine, on_loaded: Callable[[int], None] = lambda version: None) -> None:
        self.engine = engine
        self.on_loaded = on_loaded
        self._lock = threading.Lock()
        self._offer: tuple[Any, int] | None = None

    def offer(self, params: Any, version: int) -> None:
        with self._lock:
            self._offer = (params, checked_version(version, "weights version"))

    def poll(self) -> int | None:
        with self._lock:
            offer, self._offer = self._offer, None
        if offer is None:
            return None
        self.engine.update_weights(*offer)
        self.on_loaded(offer[1])
        return offer[1]
