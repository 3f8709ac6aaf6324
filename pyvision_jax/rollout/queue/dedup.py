"""The consumer's delivery dedup: each trajectory group is trained on once.

The queue delivers at least once, and a worker killed between its `put` and its cursor write
puts the same group again after a restart. Every group has a stable key (`TrajectoryGroup.key`, the same
for a group and its regeneration), so the consumer drops repeats by key.

`DeliveredGroups` keeps the keys in memory, or, given a Redis URL, in the Redis set
`<namespace>:delivered` so that they survive the consumer; `namespace` is the queue's
(`QueueConfig.namespace`, `rollout.queue_namespace`), so runs sharing one server keep apart.
"""

from __future__ import annotations

import redis

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.rollout.queue.base import QueueConfig


class DeliveredGroups:
    """The consumer's dedup: `first(group)` is True once per `TrajectoryGroup.key`.

    With `redis_url` None the keys are kept in memory; otherwise they live in the Redis set
    `<namespace>:delivered` (SADD makes the check-and-record atomic, across consumers too).
    """

    def __init__(self, redis_url: str | None, namespace: str) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"the dedup namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace
        self.redis_key = f"{namespace}:delivered"
        self._seen: set[str] = set()
        self._client = redis.Redis.from_url(redis_url) if redis_url else None

    @classmethod
    def for_queue(cls, config: QueueConfig) -> DeliveredGroups:
        """The dedup of a consumer of the queue `config`: in Redis, under the queue's namespace,
        for the redis backend; in memory for the local one."""
        return cls(config.redis_url if config.backend == "redis" else None, config.namespace)

    def first(self, group: TrajectoryGroup) -> bool:
        """True the first time a group with this key is seen, False for every repeat."""
        key = group.key
        if self._client is not None:
            return bool(self._client.sadd(self.redis_key, key))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def close(self) -> None:
        """Disconnects from Redis (nothing to do in memory)."""
        if self._client is not None:
            self._client.close()
