"""The consumer's delivery dedup: each trajectory group is trained on once.

The queue delivers at least once, and a worker killed between its `put` and its cursor write
puts the same group again after a restart. Every group has a stable key (`TrajectoryGroup.key`, the same
for a group and its regeneration), so the consumer drops repeats by key.

`DeliveredGroups` keeps the keys in memory, and, given a Redis URL, in the Redis set
`<namespace>:delivered` so that they survive the consumer (its operations wait through an
outage as the queue's do); `namespace` is the queue's (`QueueConfig.namespace`,
`rollout.queue_namespace`), so runs sharing one server keep apart. A consumer loads the set at
its first contact and keeps every key it sees or commits; when the server's epoch
(`<namespace>:epoch`, see `redis_streams.py`) changes, the server restarted without its data,
and the consumer writes the set back before it admits anything, so the groups producers put
again after such a restart are dropped as repeats when they were trained already.
"""

from __future__ import annotations

import logging
import uuid

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.rollout.queue.base import QueueConfig
from pyvision_jax.rollout.queue.redis_streams import call_through_outage, redis_client

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 7 * 24 * 3600


class DeliveredGroups:
    """The consumer's dedup over `TrajectoryGroup.key`.

    `admit(group)` is False for a key already trained on (committed) or already received and
    not yet committed; `commit(keys)` records keys once the step that trained them is
    checkpointed, so a trainer killed before that gets the same groups again (from the queue's
    pending entries) and admits them. With `redis_url` None the keys are kept in memory only;
    otherwise committed keys also live in the Redis set `<namespace>:delivered`, which expires
    `ttl_s` after the last commit (a run of another namespace never sees them).
    """

    def __init__(
        self,
        redis_url: str | None,
        namespace: str,
        ttl_s: int = DEFAULT_TTL_S,
        *,
        password: str | None = None,
        ca_file: str = "",
        outage_s: float = 600.0,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"the dedup namespace must be a non-empty string, got {namespace!r}")
        if ttl_s < 1:
            raise ValueError(f"the dedup ttl must be >= 1 s, got {ttl_s}")
        self.namespace = namespace
        self.redis_key = f"{namespace}:delivered"
        self.epoch_key = f"{namespace}:epoch"
        self._epoch: str | None = None
        self.ttl_s = int(ttl_s)
        self._committed: set[str] = set()
        self._in_flight: set[str] = set()
        self.url, self.outage_s = redis_url, float(outage_s)
        self._client = redis_client(redis_url, password, ca_file) if redis_url else None

    @classmethod
    def for_queue(cls, config: QueueConfig, ttl_s: int = DEFAULT_TTL_S) -> DeliveredGroups:
        """The dedup of a consumer of the queue `config`: in Redis, under the queue's namespace,
        for the redis backend; in memory for the local one."""
        if config.backend != "redis":
            return cls(None, config.namespace, ttl_s)
        return cls(
            config.redis_url,
            config.namespace,
            ttl_s,
            password=config.password,
            ca_file=config.ca_file,
            outage_s=config.outage_s,
        )

    def _is_committed(self, key: str) -> bool:
        if self._client is not None and key not in self._committed:
            call_through_outage(lambda: self._look_up(key), self.url, self.outage_s)
        return key in self._committed

    def _look_up(self, key: str) -> None:
        self._follow_epoch()
        if self._client.sismember(self.redis_key, key):
            self._committed.add(key)

    def _follow_epoch(self) -> None:
        """Loads the set at the first contact; writes it back after a restart that lost it."""
        with self._client.pipeline() as pipeline:
            pipeline.set(self.epoch_key, uuid.uuid4().hex, nx=True)
            pipeline.get(self.epoch_key)
            epoch = pipeline.execute()[1].decode()
        if self._epoch is None:
            self._committed.update(key.decode() for key in self._client.smembers(self.redis_key))
        elif epoch != self._epoch and self._committed:
            restored = len(self._committed)
            logger.warning("the Redis queue at %s restarted without its data: restoring %d keys", self.url, restored)
            self._store(sorted(self._committed))
        self._epoch = epoch

    def admit(self, group: TrajectoryGroup) -> bool:
        """True the first time a group with this key arrives (and until then never trained)."""
        key = group.key
        if key in self._in_flight or self._is_committed(key):
            return False
        self._in_flight.add(key)
        return True

    def commit(self, keys: list[str]) -> None:
        """Records `keys` as trained (their step is checkpointed)."""
        if not keys:
            return
        self._committed.update(keys)
        if self._client is not None:
            call_through_outage(lambda: (self._follow_epoch(), self._store(keys)), self.url, self.outage_s)
        self._in_flight.difference_update(keys)

    def _store(self, keys: list[str]) -> None:
        with self._client.pipeline() as pipeline:
            pipeline.sadd(self.redis_key, *keys)
            pipeline.expire(self.redis_key, self.ttl_s)
            pipeline.execute()

    def close(self) -> None:
        """Disconnects from Redis (nothing to do in memory)."""
        if self._client is not None:
            self._client.close()
