"""The trajectory queue between rollout producers and the trainer, and `make_queue`.

Modules: `base` (the API, its config and checks; the semantics are in its docstring),
`local` (in-process backend), `redis_streams` (Redis Streams backend) and `dedup` (the
consumer's drop of groups delivered twice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyvision_jax.rollout.queue.base import (
    BACKENDS,
    PublishedWeights,
    QueueAccessError,
    QueueConfig,
    QueueFullError,
    QueueItem,
    QueueStats,
    TrajectoryQueue,
    checked_version,
)
from pyvision_jax.rollout.queue.dedup import DeliveredGroups
from pyvision_jax.rollout.queue.local import LocalTrajectoryQueue
from pyvision_jax.rollout.queue.redis_streams import RedisTrajectoryQueue

__all__ = [
    "BACKENDS",
    "DeliveredGroups",
    "LocalTrajectoryQueue",
    "PublishedWeights",
    "QueueAccessError",
    "QueueConfig",
    "QueueFullError",
    "QueueItem",
    "QueueStats",
    "RedisTrajectoryQueue",
    "TrajectoryQueue",
    "checked_version",
    "make_queue",
]


def make_queue(
    config: QueueConfig | Mapping[str, Any], *, decode: Callable[[bytes], Any] | None = None
) -> TrajectoryQueue:
    """Builds the configured backend. `config` is a QueueConfig, a dict or a ConfigDict."""
    if not isinstance(config, QueueConfig):
        items = config.items() if hasattr(config, "items") else config
        config = QueueConfig.from_mapping(dict(items))
    if config.backend == "local":
        return LocalTrajectoryQueue(
            max_backlog=config.max_backlog,
            max_staleness=config.max_staleness,
            put_timeout_s=config.put_timeout_s,
            decode=decode,
        )
    return RedisTrajectoryQueue(
        config.redis_url,
        namespace=config.namespace,
        group=config.group,
        consumer=config.consumer,
        max_backlog=config.max_backlog,
        max_staleness=config.max_staleness,
        put_timeout_s=config.put_timeout_s,
        claim_idle_ms=config.claim_idle_ms,
        outage_s=config.outage_s,
        password=config.password,
        ca_file=config.ca_file,
        decode=decode,
    )
