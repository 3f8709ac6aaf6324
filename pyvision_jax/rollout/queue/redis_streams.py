"""The Redis backend of the trajectory queue: a Stream read through one consumer group.

The queue's semantics are those of `base.py`; this module maps them onto Redis.

Access: the URL names the user (redis://USER@HOST:PORT/DB, rediss:// for TLS) and the password
comes separately. A producer needs only to add entries, read the stream's length, count its
puts and read the trainer's version and weights; the consumer group is created by the first
consumer operation, so a producer's user needs no rights on the group (docs/fleet.md has
the ACL of each role).

Keys, all under `namespace`:
  `<ns>:groups`          the Stream; each entry has fields `v` (version) and `p` (payload)
  `<ns>:stats`           a hash of counters shared by every client (put, delivered, ...)
  `<ns>:trainer_version` the trainer's current version
  `<ns>:weights`         a hash {version, location} of the latest published weights
  `<ns>:epoch`           a token naming the server's data (see Outages)
  `<ns>:consumed`        an entry id: every entry below it has been taken or dropped

Acknowledged entries are deleted from the Stream (XACK then XDEL, in one script), so the
Stream's length is exactly the backlog (ready + pending). `put` adds an entry only while that
length is below `max_backlog`, checked and added atomically in a script, so the bound holds
with any number of producers; producers poll until there is room. XADD's MAXLEN trimming is
never used, so nothing is dropped to make room.

Consumers read new entries with XREADGROUP and, before that, reclaim with XAUTOCLAIM entries
that have been pending on any consumer (a dead one, typically) for `claim_idle_ms`. A consumer
restarted under the same name (e.g. a trainer resuming with a fixed `consumer`) first gets back
the entries it held unacknowledged before, without waiting for `claim_idle_ms`.

Outages. Every operation survives the server being unreachable for up to `outage_s`: it
retries with backoff, then fails with one line naming the server and how long it waited. With
AOF (`appendonly yes`, `appendfsync always`) a restart keeps every acknowledged put. A server
restarted without persistence comes back empty: the consumer group is created again on first
use (NOGROUP), the trainer re-asserts its version and weights announcement on every poll, and
each producer puts again the groups it lost. For that a producer keeps every group it put until
the trainer has taken it: `<ns>:consumed` (set by the acknowledging script) is an entry id
below which every entry has left the stream, and `<ns>:epoch` is a token the first client of
an empty server writes. Every put (and a producer's `trainer_version`) reads both; a changed
epoch means the server lost its data, and the producer puts its kept groups again. Groups the
trainer had taken already come back as repeats, which its dedup drops (`dedup.py`).

Delivery is at-least-once: an entry is redelivered only when it stayed unacknowledged for
`claim_idle_ms` or its consumer restarted; XACK is not bound to a consumer, so whichever holder
acknowledges first removes it and the other's `ack` returns 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis

from pyvision_jax.rollout.queue.base import (
    PublishedWeights,
    QueueAccessError,
    QueueFullError,
    QueueStats,
    RawEntry,
    TrajectoryQueue,
    check_claim_idle_ms,
    full_error,
    seconds_left,
)

# Adds the entry only while the stream (= the unacknowledged backlog) is below the bound.
# Returns {id ('' when full), the server's epoch (written from ARGV[4] when missing)}.
_PUT_SCRIPT = """
local epoch = redis.call('GET', KEYS[3])
if not epoch then
  epoch = ARGV[4]
  redis.call('SET', KEYS[3], epoch)
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return {'', epoch}
end
local id = redis.call('XADD', KEYS[1], '*', 'v', ARGV[2], 'p', ARGV[3])
redis.call('HINCRBY', KEYS[2], 'put', 1)
return {id, epoch}
"""

# Acknowledges each id that is pending in the group and deletes only those (an id that is
# not pending, e.g. never delivered, is left alone); counts them under the given field and
# moves the consumed mark: the stream's first entry, or past the newest deleted one when empty.
_ACK_SCRIPT = """
local done, newest_ms, newest_seq = 0, -1, -1
for i = 3, #ARGV do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    done = done + 1
    local ms, seq = string.match(ARGV[i], '^(%d+)-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if ms > newest_ms or (ms == newest_ms and seq > newest_seq) then
      newest_ms, newest_seq = ms, seq
    end
  end
end
if done > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], done)
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #first > 0 then
    redis.call('SET', KEYS[3], first[1][1])
  else
    redis.call('SET', KEYS[3], string.format('%d-%d', newest_ms, newest_seq + 1))
  end
end
return done
"""

logger = logging.getLogger(__name__)

_STREAM_ID = re.compile(r"^\d+-\d+$")
_MAX_POLL_S = 1.0
_MAX_BACKOFF_S = 2.0
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def _through_outages(method: Callable[..., Any]) -> Callable[..., Any]:
    """Runs a backend operation through `RedisTrajectoryQueue._resilient`."""

    @functools.wraps(method)
    def wrapper(self: "RedisTrajectoryQueue", *args: Any, **kwargs: Any) -> Any:
        return self._resilient(lambda: method(self, *args, **kwargs))

    return wrapper


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id_order(item_id: str) -> tuple[int, int]:
    """A stream entry id as (milliseconds, sequence), which orders ids as Redis does."""
    milliseconds, sequence = item_id.split("-")
    return int(milliseconds), int(sequence)


def redis_client(url: str, password: str | None = None, ca_file: str = "", **options: Any) -> redis.Redis:
    """A client of `url` (redis:// or rediss://) with the user's `password` and, for TLS, the
    certificate authority `ca_file` ("": the system's)."""
    if ca_file and url.startswith("rediss://"):
        options["ssl_ca_certs"] = ca_file
    return redis.Redis.from_url(url, password=password, **options)


def call_through_outage(operation: Callable[[], Any], url: str, outage_s: float) -> Any:
    """Runs `operation`, retrying with backoff while the server at `url` is unreachable, for up
    to `outage_s`; then a `ConnectionError` naming the server and the wait. Refused credentials
    or rights raise `QueueAccessError` at once."""
    first_failure = None
    pause = 0.05
    while True:
        try:
            return operation()
        except redis.AuthenticationError as error:
            raise QueueAccessError(f"the Redis queue at {url} refused the credentials: {error}") from None
        except redis.exceptions.NoPermissionError as error:
            raise QueueAccessError(
                f"the Redis queue at {url}: {error} (docs/fleet.md lists what each role needs)"
            ) from None
        except _TRANSIENT as error:
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= outage_s:
                raise ConnectionError(
                    f"the Redis queue at {url} has been unreachable for {now - first_failure:.0f} s "
                    f"(outage_s={outage_s:.0f}): {error}"
                ) from error
            time.sleep(pause)
            pause = min(pause * 2, _MAX_BACKOFF_S)


def default_consumer_name() -> str:
    """A name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class RedisTrajectoryQueue(TrajectoryQueue):
    """Trajectory queue over a Redis Stream and consumer group (see the module docstring).

    Threads may share one object (redis-py's client is thread-safe); every process opens its
    own, with its own consumer name.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "pyvision",
        group: str = "trainer",
        consumer: str | None = None,
        max_backlog: int = 256,
        max_staleness: int | None = 1,
        put_timeout_s: float = 600.0,
        claim_idle_ms: int = 600_000,
        outage_s: float = 600.0,
        password: str | None = None,
        ca_file: str = "",
        decode: Callable[[bytes], Any] | None = None,
    ) -> None:
        super().__init__(
            max_backlog=max_backlog, max_staleness=max_staleness, put_timeout_s=put_timeout_s, decode=decode
        )
        check_claim_idle_ms(claim_idle_ms)
        self.url = url
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.claim_idle_ms = int(claim_idle_ms)
        self.outage_s = float(outage_s)
        self._stream = f"{namespace}:groups"
        self._stats_key = f"{namespace}:stats"
        self._version_key = f"{namespace}:trainer_version"
        self._weights_key = f"{namespace}:weights"
        self._epoch_key = f"{namespace}:epoch"
        self._consumed_key = f"{namespace}:consumed"
        self._epoch: str | None = None  # the server's epoch at this producer's last put
        self._kept: dict[str, tuple[bytes, int]] = {}  # id -> (payload, version) put, not yet taken
        self._lost: list[tuple[bytes, int]] = []  # kept groups a restart without persistence lost
        self._stored_version: int | None = None  # the version this client (the trainer's) last wrote
        self._keeping = threading.RLock()
        self._poll_s = min(_MAX_POLL_S, self.claim_idle_ms / 2000)
        self._claim_cursor: bytes | str = "0-0"
        # Where to continue reading this consumer's earlier pending entries; None once done.
        self._own_cursor: bytes | str | None = "0"
        self._client = redis_client(url, password, ca_file, socket_connect_timeout=10)
        try:
            self._client.ping()
        except redis.AuthenticationError as error:
            raise QueueAccessError(f"the Redis queue at {url} refused the credentials: {error}") from None
        except redis.RedisError as error:
            raise ConnectionError(f"cannot reach the Redis queue at {url}: {error}") from error
        self._put_script = self._client.register_script(_PUT_SCRIPT)
        self._ack_script = self._client.register_script(_ACK_SCRIPT)

    def _ensure_group(self) -> None:
        """Creates the consumer group (and the stream) unless it exists."""
        try:
            self._client.xgroup_create(self._stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._claim_cursor = "0-0"

    def _resilient(self, operation: Callable[[], Any]) -> Any:
        """Runs `operation` through an outage of up to `outage_s` (`call_through_outage`),
        recreating the consumer group when a restarted server lost it."""
        while True:
            try:
                return call_through_outage(operation, self.url, self.outage_s)
            except redis.ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                self._ensure_group()

    def _put(self, payload: bytes, version: int, deadline: float) -> str:
        with self._keeping:
            self._put_lost(deadline)
            item_id = self._put_kept(payload, version, deadline)
            with contextlib.suppress(QueueFullError):  # at once, not at the next put
                self._put_lost(deadline)
            return item_id

    def _put_lost(self, deadline: float) -> None:
        """Puts again, oldest first, the kept groups a restart without persistence lost."""
        while self._lost:
            self._put_kept(*self._lost[0], deadline)
            self._lost.pop(0)

    @_through_outages
    def _put_kept(self, payload: bytes, version: int, deadline: float) -> str:
        """Puts one entry, waiting for room, and keeps it until the trainer has taken it."""
        start = time.monotonic()
        pause = 0.005
        while True:
            consumed = self._client.get(self._consumed_key)  # only grows: read before the put
            item_id, epoch = self._put_script(
                keys=[self._stream, self._stats_key, self._epoch_key],
                args=[self.max_backlog, version, payload, uuid.uuid4().hex],
            )
            self._observe(_text(epoch), _text(consumed or b""))
            if item_id:
                self._kept[_text(item_id)] = (payload, version)
                return _text(item_id)
            remaining = seconds_left(deadline)
            if remaining <= 0:
                backlog = self._client.xlen(self._stream)
                raise full_error(backlog, self.max_backlog, time.monotonic() - start)
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.1)

    def _observe(self, epoch: str, consumed: str) -> None:
        """Forgets the kept entries below the consumed mark; after a restart that lost the
        server's data (a new epoch), queues every kept entry to be put again."""
        if self._epoch is not None and epoch != self._epoch and self._kept:
            logger.warning(
                "the Redis queue at %s restarted without its data: putting %d groups again", self.url, len(self._kept)
            )
            self._lost.extend(self._kept.values())
            self._kept.clear()
        self._epoch = epoch
        if consumed:
            mark = _id_order(consumed)
            for item_id in [item_id for item_id in self._kept if _id_order(item_id) < mark]:
                del self._kept[item_id]

    def _entry(self, item_id: bytes | str, fields: dict[bytes, bytes]) -> RawEntry:
        try:
            return RawEntry(_text(item_id), int(fields[b"v"]), fields[b"p"])
        except (KeyError, ValueError) as error:
            raise ValueError(
                f"malformed entry {_text(item_id)} in Redis stream {self._stream}: "
                f"fields {sorted(_text(key) for key in fields)}"
            ) from error

    def _reclaim(self, count: int) -> list[RawEntry]:
        cursor, claimed, *_ = self._client.xautoclaim(
            self._stream, self.group, self.consumer, self.claim_idle_ms, start_id=self._claim_cursor, count=count
        )
        self._claim_cursor = cursor
        # Entries deleted meanwhile come back without fields (Redis 6.2) or not at all (7+).
        return [self._entry(item_id, fields) for item_id, fields in claimed if fields]

    def _read_new(self, count: int, block_ms: int | None) -> list[RawEntry]:
        response = self._client.xreadgroup(self.group, self.consumer, {self._stream: ">"}, count=count, block=block_ms)
        return [self._entry(item_id, fields) for _, messages in response or [] for item_id, fields in messages]

    def _own_pending(self, count: int) -> list[RawEntry]:
        """The next entries this consumer name held unacknowledged before this object existed."""
        response = self._client.xreadgroup(self.group, self.consumer, {self._stream: self._own_cursor}, count=count)
        messages = [message for _, batch in response or [] for message in batch]
        self._own_cursor = messages[-1][0] if len(messages) == count else None
        return [self._entry(item_id, fields) for item_id, fields in messages if fields]

    def _count_delivery(self, delivered: int, reclaimed: int) -> None:
        with self._client.pipeline() as pipe:
            pipe.hincrby(self._stats_key, "delivered", delivered)
            pipe.hincrby(self._stats_key, "reclaimed", reclaimed)
            pipe.execute()

    @_through_outages
    def _take(self, max_groups: int, deadline: float) -> list[RawEntry]:
        if self._own_cursor is not None:
            recovered = self._own_pending(max_groups)
            if recovered:
                self._count_delivery(len(recovered), len(recovered))
                return recovered
        while True:
            reclaimed = self._reclaim(max_groups)
            entries = list(reclaimed)
            if len(entries) < max_groups:
                remaining = seconds_left(deadline)
                block_ms = None
                if not entries and remaining > 0:
                    block_ms = max(1, int(min(remaining, self._poll_s) * 1000))
                entries += self._read_new(max_groups - len(entries), block_ms)
            if entries:
                self._count_delivery(len(entries), len(reclaimed))
                return entries
            if seconds_left(deadline) <= 0:
                return []

    @_through_outages
    def _remove_pending(self, ids: Iterable[str], counter: str) -> int:
        ids = [_text(item_id) for item_id in ids]
        for item_id in ids:
            if not _STREAM_ID.match(item_id):
                raise ValueError(f"not a Redis stream entry id: {item_id!r}")
        if not ids:
            return 0
        keys = [self._stream, self._stats_key, self._consumed_key]
        return int(self._ack_script(keys=keys, args=[self.group, counter, *ids]))

    @_through_outages
    def _store_trainer_version(self, version: int) -> None:
        self._client.set(self._version_key, version)
        self._stored_version = version

    @_through_outages
    def trainer_version(self) -> int:
        """The trainer's version; a producer also puts again here what a restart without
        persistence lost, while there is room (workers poll this between groups, also paused).

        The trainer's own queue writes back the version such a restart lost: read as 0, it would
        make the trainer drop every group put since as from the future."""
        value = self._client.get(self._version_key)
        if value is None and self._stored_version is not None:
            self._client.set(self._version_key, self._stored_version, nx=True)
            value = self._client.get(self._version_key)
        if self._kept or self._lost:
            self._recover_lost(time.monotonic())
        return 0 if value is None else int(value)

    def _recover_lost(self, deadline: float) -> None:
        """Checks the server's epoch (writing one on an empty server) and puts the lost groups
        again, waiting for room until `deadline`."""
        with self._keeping:
            self._client.set(self._epoch_key, uuid.uuid4().hex, nx=True)
            self._observe(_text(self._client.get(self._epoch_key) or b""), "")
            with contextlib.suppress(QueueFullError):
                self._put_lost(deadline)

    @_through_outages
    def _store_weights(self, weights: PublishedWeights) -> None:
        self._client.hset(self._weights_key, mapping={"version": weights.version, "location": weights.location})

    @_through_outages
    def latest_weights(self) -> PublishedWeights | None:
        fields = self._client.hgetall(self._weights_key)
        if not fields:
            return None
        return PublishedWeights(int(fields[b"version"]), _text(fields[b"location"]))

    @_through_outages
    def stats(self) -> QueueStats:
        with self._client.pipeline(transaction=True) as pipe:
            pipe.xlen(self._stream)
            pipe.xpending(self._stream, self.group)
            pipe.hgetall(self._stats_key)
            backlog, pending_summary, counters = pipe.execute()
        pending = int(pending_summary["pending"])
        return QueueStats.from_counters(
            ready=backlog - pending,
            pending=pending,
            counters={_text(key): int(value) for key, value in counters.items()},
        )

    def close(self) -> None:
        """Puts again what a restart without persistence lost (waiting up to 10 s for room),
        removes this consumer from the group when it holds nothing pending, and disconnects."""
        with contextlib.suppress(redis.RedisError):
            if self._kept or self._lost:
                self._recover_lost(time.monotonic() + 10.0)
        if self._lost:
            logger.warning("%d groups lost in a restart of the Redis queue without persistence", len(self._lost))
        try:
            mine = self._client.xpending_range(
                self._stream, self.group, min="-", max="+", count=1, consumername=self.consumer
            )
            if not mine:
                self._client.xgroup_delconsumer(self._stream, self.group, self.consumer)
        except redis.RedisError:
            pass  # best effort: a consumer entry left behind holds no data
        self._client.close()
