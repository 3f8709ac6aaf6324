"""The one task order every producer uses: tasks in a seeded order epoch after epoch, sharded
over workers, with the rollout indices and request seeds derived from it.

Each epoch the tasks are put in a seeded order (the same in every worker); worker `i` of `N`
takes the positions `p` with `p % N == i`, so the shards of one epoch are disjoint and
together complete. A consumer's progress is one integer, its cursor (tasks taken so far):
`shard.at(cursor)` is a pure function of (tasks, seed, worker, cursor), so a restarted run
that resumes from a saved cursor draws exactly what the uninterrupted run would have.

Rollout `k` of a task in epoch `e` gets the rollout index `e * G + k`: every group has a
stable key `"{task_id}#{epoch}"`, the same when it is generated again after a crash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pyvision_jax.data.tasks import Task


@dataclasses.dataclass(frozen=True)
class ShardItem:
    """The task at one cursor of a shard: its epoch and its position in that epoch's order."""

    task: Task
    epoch: int
    position: int

    def rollout_indices(self, group_size: int) -> range:
        """The rollout indices of this item's group (unique per task and epoch)."""
        return range(self.epoch * group_size, (self.epoch + 1) * group_size)


class TaskShard:
    """The tasks of worker `worker_index` of `num_workers`, epoch after epoch."""

    def __init__(self, tasks: Sequence[Task], seed: int, worker_index: int = 0, num_workers: int = 1):
        if not tasks:
            raise ValueError(
                "no tasks to draw from (data.train_files is empty and data.synthetic_kinds names no kind?)"
            )
        if num_workers < 1 or not 0 <= worker_index < num_workers:
            raise ValueError(f"worker_index must be in [0, num_workers={num_workers}), got {worker_index}")
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

    def take(self, cursor: int, count: int) -> list[ShardItem]:
        """The items at cursors `cursor .. cursor + count - 1`."""
        return [self.at(c) for c in range(cursor, cursor + count)]


def derived_seed(*parts: int) -> int:
    """A 31-bit seed derived from integers (a run seed and the indices that name one draw)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] % (2**31))
