"""The trajectory queue between rollout workers and the trainer.

The queue carries opaque payload bytes tagged with the policy version that produced them; it
does not know the trajectory format. Producers call `put` with either

* an object with a `to_bytes()` method and a `policy_version` attribute (a `TrajectoryGroup`);
  its version is that attribute and `version=` must not be given, or
* `bytes` with an explicit `version=`.

Consumers call `get`, which returns `QueueItem`s (payload bytes and, when the queue was built
with a `decode` callable, the decoded object), and `ack` the ids once the items are consumed.
An item taken but never acknowledged stays pending; on the Redis backend another consumer
reclaims it after `claim_idle_ms` (delivery is at-least-once across consumer deaths and
exactly-once while consumers acknowledge in time).

Admission: with `max_staleness = s`, `get` drops items whose version is below
`trainer_version() - s`; each dropped item is acknowledged and counted in
`stats().dropped_stale_total`, never lost silently.

Back-pressure: the backlog is every item put and not yet acknowledged (ready + pending). When it
reaches `max_backlog`, `put` blocks until consumers acknowledge; after its timeout it raises
`QueueFullError`. Data is never dropped to make room.

The trainer also shares two small values through the backend for the workers to watch: its
version (`set_trainer_version`: the version of the newest weights delivered to the generators,
which admission judges staleness against; see `rollout.sources`) and the latest published
weights (`publish_weights(version, location)` / `latest_weights()`).

Backends: `local` (in-process, thread-safe; the embedded default) in `local.py` and `redis`
(Streams with a consumer group) in `redis_streams.py`; `make_queue(config)` (the package's
`__init__`) builds either. This module holds what they share: the config, the items and
counters, the argument checks and the `TrajectoryQueue` base class.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

BACKENDS = ("local", "redis")


class QueueAccessError(PermissionError):
    """The queue's server refused the credentials (its message names the server, not the password)."""


class QueueFullError(TimeoutError):
    """`put` waited its whole timeout for the backlog to drop below `max_backlog`."""


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """Settings of a trajectory queue (`make_queue` also accepts a mapping with these keys).

    Attributes:
      backend: "local" (in process) or "redis".
      max_backlog: the most items put and not yet acknowledged; `put` blocks beyond it.
      max_staleness: `get` drops items older than `trainer_version - max_staleness`; None
        admits every version.
      put_timeout_s: how long `put` waits for room before raising `QueueFullError`
        (`math.inf` waits forever).

    The rest apply to the redis backend only:
      redis_url: the server, e.g. "redis://127.0.0.1:6379/0".
      namespace: prefix of every Redis key, so several runs can share one server.
      group: the Redis consumer group of the trainer's consumers.
      consumer: this process's consumer name within the group; None picks a unique one. Give
        a resuming trainer a fixed name to get its unacknowledged groups back at once.
      claim_idle_ms: items pending this long on a consumer are reclaimed by another one.
      outage_s: how long an unreachable server is waited for (with backoff) before an
        operation fails; an outage shorter than this costs nothing but time.
      password: the Redis user's password (the user is the URL's: redis://USER@HOST:PORT/DB);
        never part of the URL, and never shown by repr.
      ca_file: the certificate authority that signed the server's certificate, for rediss://
        (TLS) URLs ("": the system's).
    """

    backend: str = "local"
    max_backlog: int = 256
    max_staleness: int | None = 1
    put_timeout_s: float = 600.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = "pyvision"
    group: str = "trainer"
    consumer: str | None = None
    claim_idle_ms: int = 600_000
    outage_s: float = 600.0
    password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str = ""

    def __post_init__(self) -> None:
        if not self.outage_s >= 0:
            raise ValueError(f"queue.outage_s must be >= 0, got {self.outage_s}")
        if self.backend not in BACKENDS:
            raise ValueError(f"queue.backend must be one of {BACKENDS}, got {self.backend!r}")
        check_limits(self.max_backlog, self.max_staleness, self.put_timeout_s)
        check_claim_idle_ms(self.claim_idle_ms)
        if not self.namespace or not self.group:
            raise ValueError("queue.namespace and queue.group must be non-empty strings")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> QueueConfig:
        """Builds a config from a dict or ConfigDict, naming any unknown key."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown queue config keys {unknown}; known keys: {sorted(known)}")
        return cls(**dict(values))


@dataclasses.dataclass(frozen=True)
class QueueItem:
    """One group taken from the queue: its id (for `ack`), policy version and payload.

    `obj` is `decode(payload)` when the queue has a `decode` callable, else None.
    """

    id: str
    version: int
    payload: bytes
    obj: Any = None


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Queue counters; the `_total` ones count since the queue (or Redis namespace) was created.

    backlog = ready + pending: the items put and not yet acknowledged.
    """

    ready: int
    pending: int
    backlog: int
    put_total: int
    delivered_total: int
    acked_total: int
    dropped_stale_total: int
    reclaimed_total: int
    dropped_future_total: int = 0

    @classmethod
    def from_counters(cls, *, ready: int, pending: int, counters: Mapping[str, int]) -> QueueStats:
        """Stats from the item counts and the event counters (put, delivered, acked,
        dropped_stale, reclaimed; a missing one is 0)."""
        return cls(
            ready=ready,
            pending=pending,
            backlog=ready + pending,
            put_total=counters.get("put", 0),
            delivered_total=counters.get("delivered", 0),
            acked_total=counters.get("acked", 0),
            dropped_stale_total=counters.get("dropped_stale", 0),
            reclaimed_total=counters.get("reclaimed", 0),
            dropped_future_total=counters.get("dropped_future", 0),
        )


@dataclasses.dataclass(frozen=True)
class PublishedWeights:
    """The latest weights the trainer published: their version and where they are."""

    version: int
    location: str


@dataclasses.dataclass(frozen=True)
class RawEntry:
    """A backend's entry before admission and decoding."""

    id: str
    version: int
    payload: bytes


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_limits(max_backlog: Any, max_staleness: Any, put_timeout_s: Any) -> None:
    """Raises a ValueError naming the first invalid queue limit."""
    if not _is_int(max_backlog) or max_backlog < 1:
        raise ValueError(f"queue.max_backlog must be an integer >= 1, got {max_backlog!r}")
    if max_staleness is not None and (not _is_int(max_staleness) or max_staleness < 0):
        raise ValueError(f"queue.max_staleness must be None or an integer >= 0, got {max_staleness!r}")
    if not isinstance(put_timeout_s, (int, float)) or not put_timeout_s > 0:
        raise ValueError(f"queue.put_timeout_s must be a number > 0, got {put_timeout_s!r}")


def check_claim_idle_ms(claim_idle_ms: Any) -> None:
    """Raises a ValueError unless `claim_idle_ms` is an integer >= 1."""
    if not _is_int(claim_idle_ms) or claim_idle_ms < 1:
        raise ValueError(f"queue.claim_idle_ms must be an integer >= 1, got {claim_idle_ms!r}")


def checked_version(value: Any, what: str = "version") -> int:
    """`value` as a non-negative int, or a ValueError naming `what`."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def payload_and_version(group: Any, version: int | None) -> tuple[bytes, int]:
    """The bytes and version to enqueue for `put(group, version=version)`."""
    if isinstance(group, (bytes, bytearray, memoryview)):
        if version is None:
            raise TypeError("put(bytes) needs version=<policy version that produced the payload>")
        return bytes(group), checked_version(version)
    to_bytes = getattr(group, "to_bytes", None)
    if not callable(to_bytes) or not hasattr(group, "policy_version"):
        raise TypeError(
            f"put() takes bytes with version= or an object with to_bytes() and policy_version; "
            f"got {type(group).__name__}"
        )
    if version is not None:
        raise TypeError(f"put({type(group).__name__}) takes its version from .policy_version; do not pass version=")
    payload = to_bytes()
    if not isinstance(payload, bytes):
        raise TypeError(f"{type(group).__name__}.to_bytes() must return bytes, got {type(payload).__name__}")
    return payload, checked_version(group.policy_version, f"{type(group).__name__}.policy_version")


def deadline_after(timeout: float | None) -> float:
    """A monotonic deadline `timeout` seconds from now (None: never)."""
    if timeout is None:
        return math.inf
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return time.monotonic() + timeout


def seconds_left(deadline: float) -> float:
    """Seconds until the monotonic `deadline`, never below 0."""
    return max(0.0, deadline - time.monotonic())


def full_error(backlog: int, max_backlog: int, waited_s: float) -> QueueFullError:
    """The error `put` raises after waiting `waited_s` seconds for room."""
    return QueueFullError(
        f"trajectory queue backlog stayed at {backlog} >= max_backlog={max_backlog} for "
        f"{waited_s:.1f}s; the trainer is not acknowledging groups (raise queue.max_backlog or "
        f"queue.put_timeout_s, or check the trainer)"
    )


class TrajectoryQueue(abc.ABC):
    """The queue API shared by the backends (see the module docstring for the semantics)."""

    def __init__(
        self,
        *,
        max_backlog: int,
        max_staleness: int | None,
        put_timeout_s: float,
        decode: Callable[[bytes], Any] | None,
    ) -> None:
        check_limits(max_backlog, max_staleness, put_timeout_s)
        self.max_backlog = max_backlog
        self.max_staleness = max_staleness
        self.put_timeout_s = put_timeout_s
        self._decode = decode

    def put(self, group: Any, *, version: int | None = None, timeout: float | None = None) -> str:
        """Enqueues one group and returns its id; blocks while the backlog is full.

        `timeout` (seconds) defaults to the queue's `put_timeout_s`; when it runs out the call
        raises `QueueFullError` and nothing is enqueued.
        """
        payload, version = payload_and_version(group, version)
        wait = self.put_timeout_s if timeout is None else timeout
        return self._put(payload, version, deadline_after(None if math.isinf(wait) else wait))

    def get(self, max_groups: int = 1, timeout: float | None = None) -> list[QueueItem]:
        """Takes up to `max_groups` admitted items, waiting up to `timeout` seconds for one.

        Returns as soon as at least one admitted item is available (possibly fewer than
        `max_groups`), or an empty list when the timeout passes; `timeout=None` waits forever
        and 0 does not wait. Stale items met on the way are acknowledged and counted.
        """
        if not _is_int(max_groups) or max_groups < 1:
            raise ValueError(f"max_groups must be an integer >= 1, got {max_groups!r}")
        deadline = deadline_after(timeout)
        while True:
            admitted = self._admit(self._take(int(max_groups), deadline))
            if admitted or seconds_left(deadline) <= 0:
                return [self._item(entry) for entry in admitted]

    def _admit(self, entries: list[RawEntry]) -> list[RawEntry]:
        """Drops (counted) entries older than `max_staleness` versions and entries from a
        version newer than the trainer's (weights a restarted trainer discarded)."""
        if self.max_staleness is None or not entries:
            return entries
        newest = self.trainer_version()
        oldest_admitted = newest - self.max_staleness
        for reason, rejected in (
            ("dropped_stale", [e for e in entries if e.version < oldest_admitted]),
            ("dropped_future", [e for e in entries if e.version > newest]),
        ):
            if rejected:
                self._remove_pending([entry.id for entry in rejected], reason)
                logger.info(
                    "%s: %d trajectory groups of versions %s (trainer version %d, max_staleness %d)",
                    reason,
                    len(rejected),
                    sorted({e.version for e in rejected}),
                    newest,
                    self.max_staleness,
                )
        return [entry for entry in entries if oldest_admitted <= entry.version <= newest]

    def _item(self, entry: RawEntry) -> QueueItem:
        if self._decode is None:
            return QueueItem(entry.id, entry.version, entry.payload)
        try:
            obj = self._decode(entry.payload)
        except Exception as error:
            raise ValueError(
                f"decoding queue item {entry.id} (version {entry.version}, {len(entry.payload)} bytes) failed: {error}"
            ) from error
        return QueueItem(entry.id, entry.version, entry.payload, obj)

    @abc.abstractmethod
    def _put(self, payload: bytes, version: int, deadline: float) -> str:
        """Enqueues when the backlog allows before `deadline`, else raises QueueFullError."""

    @abc.abstractmethod
    def _take(self, max_groups: int, deadline: float) -> list[RawEntry]:
        """Moves up to `max_groups` entries to pending, waiting until `deadline` for one."""

    @abc.abstractmethod
    def _remove_pending(self, ids: Iterable[str], counter: str) -> int:
        """Acknowledges the pending ones of `ids`, adds their number to `counter` (acked or
        dropped_stale) and returns it; ids not pending are ignored."""

    @abc.abstractmethod
    def _store_trainer_version(self, version: int) -> None:
        """Stores the (checked) trainer version."""

    @abc.abstractmethod
    def _store_weights(self, weights: PublishedWeights) -> None:
        """Stores the (checked) weights announcement."""

    def ack(self, ids: Iterable[str]) -> int:
        """Acknowledges pending items; returns how many were pending (unknown ids are ignored)."""
        return self._remove_pending(ids, "acked")

    def set_trainer_version(self, version: int) -> None:
        """Records the trainer's version (its newest weights delivered to the generators) for
        admission and for the workers."""
        self._store_trainer_version(checked_version(version, "trainer version"))

    def publish_weights(self, version: int, location: str) -> None:
        """Announces that the weights of `version` are complete at `location`."""
        if not isinstance(location, str) or not location:
            raise ValueError(f"weights location must be a non-empty string, got {location!r}")
        self._store_weights(PublishedWeights(checked_version(version, "weights version"), location))

    @abc.abstractmethod
    def trainer_version(self) -> int:
        """The trainer's version as last set (0 before any `set_trainer_version`)."""

    @abc.abstractmethod
    def latest_weights(self) -> PublishedWeights | None:
        """The last `publish_weights` announcement, or None."""

    @abc.abstractmethod
    def stats(self) -> QueueStats:
        """A snapshot of the queue's counters."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the backend's resources; the queue is unusable afterwards."""

    def __enter__(self) -> TrajectoryQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
