"""A rollout worker: prompts from its shard -> G episodes -> scored group -> trajectory queue.

Sharding. Each epoch the tasks are put in a seeded order (the same in every worker); worker
`i` of `N` takes the positions `p` with `p % N == i`. The shards of one epoch are disjoint and
together complete. A worker's progress is one integer, its cursor (groups finished), kept in
a small file (`CursorFile`) that is rewritten atomically after each put, so a restarted worker
continues where the killed one stopped.

Group identity and exactly-once. Rollout `k` of a task in epoch `e` gets the rollout index
`e * G + k`, so every group has a stable key `"{task_id}#{epoch}"` (`group_key`), the same
when a group is generated again. The queue's `put` is atomic, and the cursor advances only
after it returns, so a crash loses nothing: the group being generated is redone by the
restarted worker. The only duplicate a crash can cause is a group that was put but whose
cursor write was cut short; the consumer drops it by key (`DeliveredGroups`). Together this
is exactly-once from the consumer's point of view, without leases or a coordinator (the
queue API has no idempotent put, which would move the dedup into the queue).

Versions and staleness. Between groups the worker asks its `WeightsWatcher` for newly
announced weights. Every group carries the policy version of the engine that generated it.
Before a group it reads the trainer's version from the queue and, while its engine is more
than `max_staleness` versions ahead of it (the trainer restarted from an older checkpoint,
or weights are announced before the trainer version), it waits (polling) instead of
producing; nothing is dropped. How far the produced data may run ahead of the trainer is
bounded by the queue's `max_backlog` (put blocks).

Scoring. Groups are scored by the trainer's own `score_groups` (per trajectory
`rl.trajectory_scoring.score_trajectory`, the one rule shared with evaluation); the worker reports the scores and rewards of
each group it produced (`ProducedGroup`), the payload on the queue is the `TrajectoryGroup`.

Stopping. `request_stop()` (SIGTERM in the launcher) lets the current group finish and be
put, then returns; a group is never put partially.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyvision_jax.agent.episode import EpisodeConfig, EpisodeRunner, SandboxSource
from pyvision_jax.data.tasks import Task
from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.agent.engine import Engine, SamplingParams
from pyvision_jax.rollout.queue import QueueFullError, TrajectoryQueue
from pyvision_jax.rollout.weights import IncompleteWeightsError, WeightsWatcher, check_complete
from pyvision_jax.train.groups import score_groups

logger = logging.getLogger(__name__)


def open_hf_tensors(path: str | os.PathLike) -> tuple[int, Iterator[tuple[str, Any]]]:
    """(version, (tensor name, torch tensor) pairs) of the complete published version at `path`.

    Every safetensors file is opened (memory-mapped) before the version is checked complete a
    second time, so a version pruned while its tensors stream out still yields all of them.
    """
    from safetensors import safe_open

    version = check_complete(path)
    try:
        handles = [safe_open(str(f), framework="pt") for f in sorted(Path(path).glob("*.safetensors"))]
    except OSError as error:
        raise IncompleteWeightsError(f"{path}: vanished while opening: {error}") from error
    check_complete(path)
    if not handles:
        raise IncompleteWeightsError(f"{path}: no *.safetensors files")
    return version, ((name, handle.get_tensor(name)) for handle in handles for name in handle.keys())


class HfTensorsWatcher(WeightsWatcher):
    """A `WeightsWatcher` for engines that take HF-layout (name, tensor) pairs (vLLM): the
    announced version's safetensors go to `engine.update_weights` as stored, with no Flax
    params in between."""

    def poll(self) -> int | None:
        announced = self.queue.latest_weights()
        if announced is None or announced.version == self.engine.version:
            return None
        try:
            version, tensors = open_hf_tensors(announced.location)
        except IncompleteWeightsError as error:
            logger.warning("announced weights version %d not loadable yet: %s", announced.version, error)
            return None
        self.engine.update_weights(tensors, version)
        logger.info("pushed weights version %d from %s", version, announced.location)
        return version


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Settings of one rollout worker.

    max_staleness: pause while the engine's version exceeds the trainer's by more than this;
      None never pauses.
    max_epochs: stop after this many passes over the shard; None runs until stopped.
    poll_s: how often a paused worker (or a put waiting for room) checks again.
    """

    worker_index: int = 0
    num_workers: int = 1
    group_size: int = 4
    max_staleness: int | None = 0
    max_epochs: int | None = None
    seed: int = 0
    tool_reward_coef: float = 0.1
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.worker_index < self.num_workers:
            raise ValueError(f"worker_index must be in [0, {self.num_workers}), "
                             f"got {self.worker_index}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be None or >= 0, got {self.max_staleness}")
        if self.max_epochs is not None and self.max_epochs < 1:
            raise ValueError(f"max_epochs must be None or >= 1, got {self.max_epochs}")
        if not self.poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {self.poll_s}")


@dataclasses.dataclass(frozen=True)
class ShardItem:
    """The task at one cursor of a shard: its epoch and its position in that epoch's order."""

    task: Task
    epoch: int
    position: int


class PromptShard:
    """The tasks of worker `worker_index` of `num_workers`, epoch after epoch."""

    def __init__(self, tasks: Sequence[Task], seed: int, worker_index: int, num_workers: int):
        if not tasks:
            raise ValueError("the rollout worker has no tasks")
        if len(tasks) < num_workers:
            raise ValueError(f"{len(tasks)} tasks cannot be sharded over {num_workers} workers")
        self.tasks = tuple(tasks)
        self.seed = seed
        self.positions = tuple(range(worker_index, len(tasks), num_workers))

    @property
    def per_epoch(self) -> int:
        return len(self.positions)

    def order(self, epoch: int) -> np.ndarray:
        """The seeded task order of `epoch`, shared by every worker."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def at(self, cursor: int) -> ShardItem:
        epoch, offset = divmod(cursor, self.per_epoch)
        position = self.positions[offset]
        return ShardItem(self.tasks[int(self.order(epoch)[position])], epoch, position)


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w") as handle:
            json.dump({"cursor": cursor}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, self.path)


def cursor_path(state_dir: str | os.PathLike, worker_index: int, num_workers: int) -> Path:
    return Path(state_dir) / f"worker-{worker_index}-of-{num_workers}.json"


def group_key(group: TrajectoryGroup) -> str:
    """`"{task_id}#{epoch}"`: the same for a group and its regeneration after a crash."""
    first = min(t.rollout_index for t in group.trajectories)
    return f"{group.task.id}#{first // len(group)}"


class DeliveredGroups:
    """The consumer's dedup: `first(group)` is True once per `group_key`.

    In memory by default; with `redis_url` the keys live in a Redis set (`<namespace>:delivered`)
    so that they survive the consumer (SADD makes the check-and-record atomic).
    """

    def __init__(self, redis_url: str | None = None, namespace: str = "pyvision"):
        self._seen: set[str] = set()
        self._client = None
        self._key = f"{namespace}:delivered"
        if redis_url:
            import redis

            self._client = redis.Redis.from_url(redis_url)

    def first(self, group: TrajectoryGroup) -> bool:
        key = group_key(group)
        if self._client is not None:
            return bool(self._client.sadd(self._key, key))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


@dataclasses.dataclass(frozen=True)
class ProducedGroup:
    """What the worker put on the queue for one prompt."""

    key: str
    queue_id: str
    cursor: int
    version: int
    scores: tuple[float, ...]
    correct: tuple[bool, ...]
    rewards: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class WorkerSummary:
    produced: tuple[ProducedGroup, ...]
    cursor: int
    versions_loaded: tuple[int, ...]
    pauses: int
    stopped: bool


def group_seed(seed: int, epoch: int, position: int) -> int:
    """The sampling seed of one group (request ids already differ per rollout and epoch)."""
    return int(np.random.SeedSequence([seed, epoch, position]).generate_state(1)[0] % (2**31))


class RolloutWorker:
    """Produces scored trajectory groups from one shard of the tasks into a queue."""

    def __init__(self, config: WorkerConfig, *, tasks: Sequence[Task], engine: Engine,
                 tokenizer: Any, sandboxes: SandboxSource, queue: TrajectoryQueue,
                 episode: EpisodeConfig = EpisodeConfig(),
                 sampling: SamplingParams = SamplingParams(),
                 weights: WeightsWatcher | None = None, cursor: CursorFile | None = None,
                 log: Callable[[str], None] = logger.info):
        self.config = config
        self.shard = PromptShard(tasks, config.seed, config.worker_index, config.num_workers)
        self.engine, self.tokenizer, self.sandboxes = engine, tokenizer, sandboxes
        self.queue, self.episode, self.sampling = queue, episode, sampling
        self.weights = weights
        self.cursor_file = cursor
        self.log = log
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Stop after the current group (which is put if it completes)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_groups: int | None = None) -> WorkerSummary:
        """Produces groups until `max_groups`, `max_epochs` or a stop request."""
        c = self.config
        cursor = self.cursor_file.load() if self.cursor_file is not None else 0
        produced: list[ProducedGroup] = []
        loaded: list[int] = []
        pauses = 0
        self.log(f"worker {c.worker_index}/{c.num_workers}: starting at cursor {cursor} "
                 f"({self.shard.per_epoch} tasks per epoch)")
        while not self._stop.is_set() and (max_groups is None or len(produced) < max_groups):
            if c.max_epochs is not None and cursor >= c.max_epochs * self.shard.per_epoch:
                break
            if self.weights is not None and (version := self.weights.poll()) is not None:
                loaded.append(version)
            if self._ahead_of_trainer():
                pauses += 1
                if not self._wait_for_trainer(loaded):
                    break
            item = self.shard.at(cursor)
            group = self._generate(item)
            scored = score_groups([group], c.group_size, 1, self.tokenizer, c.tool_reward_coef)
            queue_id = self._put(group)
            if queue_id is None:
                break
            cursor += 1
            if self.cursor_file is not None:
                self.cursor_file.save(cursor)
            produced.append(ProducedGroup(
                key=group_key(group), queue_id=queue_id, cursor=cursor - 1,
                version=group.policy_version,
                scores=tuple(float(x) for x in scored.scores[0, :len(group)]),
                correct=tuple(bool(x) for x in scored.correct[0, :len(group)]),
                rewards=tuple(float(x) for x in scored.rewards[0, :len(group)])))
            self.log(f"worker {c.worker_index}/{c.num_workers}: put {produced[-1].key} "
                     f"version {group.policy_version} mean reward "
                     f"{np.mean(produced[-1].rewards):.3f}")
        return WorkerSummary(tuple(produced), cursor, tuple(loaded), pauses, self._stop.is_set())

    def _ahead_of_trainer(self) -> bool:
        staleness = self.config.max_staleness
        return staleness is not None and self.engine.version - self.queue.trainer_version() > staleness

    def _wait_for_trainer(self, loaded: list[int]) -> bool:
        """Polls until the trainer catches up (True) or a stop is requested (False)."""
        self.log(f"worker {self.config.worker_index}: engine version {self.engine.version} is more "
                 f"than {self.config.max_staleness} ahead of trainer version "
                 f"{self.queue.trainer_version()}; pausing")
        while self._ahead_of_trainer():
            if self._stop.wait(self.config.poll_s):
                return False
            if self.weights is not None and (version := self.weights.poll()) is not None:
                loaded.append(version)
        self.log(f"worker {self.config.worker_index}: trainer at version "
                 f"{self.queue.trainer_version()}; resuming")
        return True

    def _generate(self, item: ShardItem) -> TrajectoryGroup:
        size = self.config.group_size
        sampling = dataclasses.replace(
            self.sampling, seed=group_seed(self.config.seed, item.epoch, item.position))
        runner = EpisodeRunner(self.engine, self.tokenizer, self.sandboxes, self.episode, sampling)
        jobs = [(item.task, item.epoch * size + k) for k in range(size)]
        trajectories = runner.run_trajectories(jobs)
        if len(trajectories) != size:
            raise RuntimeError(f"task {item.task.id}: {len(trajectories)} of {size} episodes "
                               f"finished")
        return TrajectoryGroup(item.task, tuple(trajectories))

    def _put(self, group: TrajectoryGroup) -> str | None:
        """Puts `group`, waiting for room; None when a stop is requested while waiting."""
        while True:
            try:
                return self.queue.put(group, timeout=self.config.poll_s)
            except QueueFullError:
                if self._stop.is_set():
                    self.log(f"worker {self.config.worker_index}: stopping with the queue full; "
                             f"{group_key(group)} not put (regenerated on restart)")
                    return None
