"""The rollout loop: task shard -> `GroupProducer` -> scored groups -> trajectory queue.

The same loop runs as a fleet process (`launch/rollout_worker.py`, Redis queue, weights from
published safetensors) and as the trainer's background thread (local queue, weights handed
over in memory); the trainer's synchronous source calls the producer directly.

Progress and exactly-once. The worker's progress is its cursor in its `TaskShard` (tasks
finished), kept in a small file (`CursorFile`) rewritten atomically after each put, so a
restarted worker continues where the killed one stopped. The queue's `put` is atomic and the
cursor advances only after it returns, so a crash loses nothing: the groups being generated
are redone. The only duplicate a crash can cause is a group that was put but whose cursor
write was cut short; the consumer drops it by `TrajectoryGroup.key` (`DeliveredGroups`).

Versions and staleness. Between batches the worker asks its weights watcher for new weights.
Every group carries the policy version of the engine that generated it. While its engine is
more than `max_staleness` versions ahead of the trainer's version on the queue (the trainer
restarted from an older checkpoint, or weights are announced before the trainer version),
it waits (polling) instead of producing; nothing is dropped. How far the produced data may
run ahead of the trainer is bounded by the queue's `max_backlog` (put blocks).

Stopping. `request_stop()` (SIGTERM in the launcher) lets the current batch finish and be
put, then returns; a group is never put partially.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data.task_order import ShardItem, TaskShard
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.producer import GroupProducer
from pyvision_jax.rollout.queue import QueueFullError, TrajectoryQueue

logger = logging.getLogger(__name__)


class WeightsSource(Protocol):
    """Loads new weights into the worker's engine if there are any; returns their version."""

    def poll(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Settings of one rollout loop.

    groups_per_batch: tasks generated together (one engine batch across their groups), when
      not streaming.
    stream: run the groups as a stream (`GroupProducer.stream`): episodes of many groups in
      flight (the episode config's max_concurrent), a group put the moment its G episodes end
      and the next task started in its place; no barrier per batch or per turn.
    max_staleness: pause while the engine's version exceeds the trainer's by more than this;
      None never pauses.
    max_epochs: stop after this many passes over the shard; None runs until stopped.
    poll_s: how often a paused worker (or a put waiting for room) checks again.
    """

    worker_index: int = 0
    num_workers: int = 1
    seed: int = 0
    groups_per_batch: int = 1
    stream: bool = False
    max_staleness: int | None = 0
    max_epochs: int | None = None
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.worker_index < self.num_workers:
            raise ValueError(f"worker_index must be in [0, {self.num_workers}), got {self.worker_index}")
        if self.groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {self.groups_per_batch}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be None or >= 0, got {self.max_staleness}")
        if self.max_epochs is not None and self.max_epochs < 1:
            raise ValueError(f"max_epochs must be None or >= 1, got {self.max_epochs}")
        if not self.poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {self.poll_s}")


class CursorWriteError(OSError):
    """A worker's cursor could not be written (a full disk, say); its message names the file and the cause."""


class CursorFile:
    """A worker's cursor on disk, rewritten atomically (temp file + rename)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> int:
        try:
            value = json.loads(self.path.read_text())["cursor"]
        except FileNotFoundError:
            return 0
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{self.path}: unreadable worker cursor: {error}") from error
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{self.path}: cursor must be a non-negative integer, got {value!r}")
        return value

    def save(self, cursor: int) -> None:
        """Writes `cursor`; raises `CursorWriteError` when it cannot (the previous one stays)."""
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w") as handle:
                json.dump({"cursor": cursor}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(temporary, self.path)
        except OSError as error:
            raise CursorWriteError(
                f"worker cursor {self.path} not written (cursor {cursor}): {error.strerror or error}"
            ) from None


def cursor_path(state_dir: str | os.PathLike, worker_index: int, num_workers: int) -> Path:
    return Path(state_dir) / f"worker-{worker_index}-of-{num_workers}.json"


@dataclasses.dataclass(frozen=True)
class ProducedGroup:
    """What the worker put on the queue for one task."""

    key: str
    queue_id: str
    cursor: int
    version: int
    rewards: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class WorkerSummary:
    produced: tuple[ProducedGroup, ...]
    cursor: int
    versions_loaded: tuple[int, ...]
    pauses: int
    stopped: bool


class RolloutWorker:
    """Produces scored groups from one shard of the tasks into a queue, in shard order."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        tasks: Sequence[Task],
        producer: GroupProducer,
        queue: TrajectoryQueue,
        weights: WeightsSource | None = None,
        cursor: CursorFile | None = None,
        log: Callable[[str], None] = logger.info,
    ):
        self.config = config
        self.shard = TaskShard(tasks, config.seed, config.worker_index, config.num_workers)
        self.producer, self.queue, self.weights = producer, queue, weights
        self.cursor_file = cursor
        self.log = log
        self._stop = threading.Event()

    @property
    def engine_version(self) -> int:
        return self.producer.engine.version

    def request_stop(self) -> None:
        """Stop after the current batch (which is put if it completes)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_groups: int | None = None, start: int | None = None) -> WorkerSummary:
        """Produces groups until `max_groups`, `max_epochs` or a stop request, from cursor
        `start` (default: the cursor file's, else 0)."""
        c = self.config
        if start is None:
            start = self.cursor_file.load() if self.cursor_file is not None else 0
        cursor = start
        produced: list[ProducedGroup] = []
        loaded: list[int] = []
        pauses = 0
        self.log(
            f"worker {c.worker_index}/{c.num_workers}: starting at cursor {cursor} "
            f"({self.shard.per_epoch} tasks per epoch){' streaming' if c.stream else ''}"
        )
        if c.stream:
            return self._run_stream(cursor, max_groups)
        while not self._stop.is_set():
            count = self._batch_size(cursor, max_groups, len(produced))
            if count == 0:
                break
            self._poll_weights(loaded)
            if self._ahead_of_trainer():
                pauses += 1
                if not self._wait_for_trainer(loaded):
                    break
            batch = self.producer.produce(self.shard.take(cursor, count))
            cursor, stopped = self._put_groups(enumerate(batch, cursor), cursor, produced)
            if stopped:
                return WorkerSummary(tuple(produced), cursor, tuple(loaded), pauses, True)
        return WorkerSummary(tuple(produced), cursor, tuple(loaded), pauses, self._stop.is_set())

    def _run_stream(self, start: int, max_groups: int | None) -> WorkerSummary:
        """`run` as a stream: items are started as room frees up and put as they finish, in
        completion order. The saved cursor is the end of the finished prefix of the shard
        order, so a restart redoes exactly the unfinished items and those finished past the
        first unfinished one; the consumer drops the redone ones it already has by key."""
        feed = _ShardFeed(self, start, max_groups)
        produced: list[ProducedGroup] = []
        finished = (
            (feed.cursors.pop((item.epoch, item.position)), group)
            for item, group in self.producer.stream(feed, poll_s=self.config.poll_s)
        )
        cursor, stopped = self._put_groups(finished, start, produced)
        return WorkerSummary(tuple(produced), cursor, tuple(feed.loaded), feed.pauses, stopped or self._stop.is_set())

    def _put_groups(
        self, groups: Iterable[tuple[int, TrajectoryGroup]], cursor: int, produced: list[ProducedGroup]
    ) -> tuple[int, bool]:
        """Puts each (shard position, group) as it comes, recording it in `produced`, and saves
        the cursor: the end of the finished prefix of the shard order from `cursor`. Returns
        (cursor, whether a stop cut a put short)."""
        c = self.config
        finished: set[int] = set()
        for position, group in groups:
            queue_id = self._put(group)
            if queue_id is None:
                return cursor, True
            finished.add(position)
            while cursor in finished:
                finished.remove(cursor)
                cursor += 1
            if self.cursor_file is not None:
                self.cursor_file.save(cursor)
            rewards = group.scores.rewards
            produced.append(ProducedGroup(group.key, queue_id, position, group.policy_version, rewards))
            self.log(
                f"worker {c.worker_index}/{c.num_workers}: put {group.key} version "
                f"{group.policy_version} mean reward {sum(rewards) / len(rewards):.3f}"
            )
        return cursor, False

    def _batch_size(self, cursor: int, max_groups: int | None, produced: int) -> int:
        """How many tasks the next batch takes (0: done), never past an epoch limit or max_groups."""
        left = self._remaining(cursor, max_groups, produced)
        return self.config.groups_per_batch if left is None else min(self.config.groups_per_batch, left)

    def _remaining(self, cursor: int, max_groups: int | None, produced: int) -> int | None:
        """How many more tasks `max_groups` and `max_epochs` allow from `cursor` (None: no limit)."""
        limits = []
        if max_groups is not None:
            limits.append(max_groups - produced)
        if self.config.max_epochs is not None:
            limits.append(self.config.max_epochs * self.shard.per_epoch - cursor)
        return max(min(limits), 0) if limits else None

    def _poll_weights(self, loaded: list[int]) -> None:
        if self.weights is not None and (version := self.weights.poll()) is not None:
            loaded.append(version)

    def _ahead_of_trainer(self) -> bool:
        staleness = self.config.max_staleness
        return staleness is not None and self.engine_version - self.queue.trainer_version() > staleness

    def _log_pause(self) -> None:
        self.log(
            f"worker {self.config.worker_index}: engine version {self.engine_version} is more "
            f"than {self.config.max_staleness} ahead of trainer version "
            f"{self.queue.trainer_version()}; pausing"
        )

    def _wait_for_trainer(self, loaded: list[int]) -> bool:
        """Polls until the trainer catches up (True) or a stop is requested (False)."""
        self._log_pause()
        while self._ahead_of_trainer():
            if self._stop.wait(self.config.poll_s):
                return False
            self._poll_weights(loaded)
        self.log(f"worker {self.config.worker_index}: trainer at version {self.queue.trainer_version()}; resuming")
        return True

    def _put(self, group: TrajectoryGroup) -> str | None:
        """Puts `group`, waiting for room; None when a stop is requested while waiting."""
        while True:
            try:
                return self.queue.put(group, timeout=self.config.poll_s)
            except QueueFullError:
                if self._stop.is_set():
                    self.log(
                        f"worker {self.config.worker_index}: stopping with the queue full; "
                        f"{group.key} not put (regenerated on restart)"
                    )
                    return None


class _ShardFeed:
    """A streaming worker's item feed: the shard from the start cursor on, one item per
    started group, nothing while the engine is too far ahead of the trainer (new weights are
    polled at each request), and none after a stop, `max_groups` or `max_epochs`."""

    def __init__(self, worker: RolloutWorker, start: int, max_groups: int | None):
        self.worker, self.next, self.max_groups = worker, start, max_groups
        self.issued = 0
        self.cursors: dict[tuple[int, int], int] = {}
        self.loaded: list[int] = []
        self.pauses = 0
        self._paused = False

    def take(self, count: int) -> list[ShardItem] | None:
        worker = self.worker
        left = worker._remaining(self.next, self.max_groups, self.issued)
        if worker.stopping or left == 0:
            return None
        worker._poll_weights(self.loaded)
        if worker._ahead_of_trainer():
            if not self._paused:
                self.pauses += 1
                worker._log_pause()
            self._paused = True
            return []
        self._paused = False
        items = worker.shard.take(self.next, count if left is None else min(count, left))
        for item in items:
            self.cursors[(item.epoch, item.position)] = self.next
            self.next += 1
        self.issued += len(items)
        return items
