"""The one place where tasks become scored episode groups.

`GroupProducer.produce(items)` runs G episodes of each task (all of them concurrently through
one `EpisodeRunner`, so the engine batches across groups), then scores every group exactly
once: per rollout the answer score and correctness (`grading.routes.grade_trajectories`: the
scorer each task's data_source routes to, rule scorers or the LLM judge, whose requests for
the whole batch run concurrently), the successful tool calls, the reward
(`rl.accumulative_tool_reward`), and whether grading failed (a judge failure marks the
rollout broken, never wrong). The scores travel on the group (`TrajectoryGroup.scores`);
nothing downstream decodes or scores again.

Rollout `k` of a task drawn in epoch `e` has rollout index `e * G + k` (see
`data.task_order`); the engine derives each request's randomness from the sampling seed and
the request id, so a group is reproducible whatever batch it is generated in.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from pyvision_jax.agent.engine import Engine, SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner, SandboxSource
from pyvision_jax.agent.trajectory import GroupScores, Trajectory, TrajectoryGroup
from pyvision_jax.data.task_order import ShardItem, derived_seed
from pyvision_jax.grading.routes import Graded, ScorerRoutes, grade_trajectories
from pyvision_jax.rl.rewards import accumulative_tool_reward


def with_scores(group: TrajectoryGroup, graded: Sequence[Graded], tool_reward_coef: float) -> TrajectoryGroup:
    """`group` with the `GroupScores` of its graded rollouts (a broken rollout or one without an
    answer scores 0)."""
    scores = [g.score for g in graded]
    tool_calls = [t.num_successful_tool_calls for t in group.trajectories]
    values = np.asarray([[s.score for s in scores]], np.float32)
    correct = np.asarray([[s.correct for s in scores]], bool)
    rewards = accumulative_tool_reward(
        values, correct, np.asarray([tool_calls], np.float32), np.ones_like(correct), tool_reward_coef
    )
    return group.with_scores(
        GroupScores(
            scores=tuple(float(s.score) for s in scores),
            correct=tuple(bool(s.correct) for s in scores),
            tool_calls=tuple(int(n) for n in tool_calls),
            rewards=tuple(float(r) for r in np.asarray(rewards)[0]),
            broken=tuple(g.broken for g in graded),
        )
    )


def score_groups(
    groups: Sequence[TrajectoryGroup], tokenizer: Any, tool_reward_coef: float, routes: ScorerRoutes = ScorerRoutes()
) -> list[TrajectoryGroup]:
    """The groups with their scores, every rollout graded once in one batch."""
    graded = grade_trajectories([(t, g.task) for g in groups for t in g.trajectories], tokenizer, routes)
    out, start = [], 0
    for group in groups:
        out.append(with_scores(group, graded[start : start + len(group)], tool_reward_coef))
        start += len(group)
    return out


class ItemFeed(Protocol):
    """Hands `GroupProducer.stream` its shard items as room frees up."""

    def take(self, count: int) -> list[ShardItem] | None:
        """At most `count` items to start now ([] when none just now), None when there are no more."""
        ...


class _GroupJobs:
    """The runner's job feed over an item feed: G jobs per item, and which item each
    admitted job (by admission position) belongs to."""

    def __init__(self, items: ItemFeed, group_size: int):
        self.items, self.group_size = items, group_size
        self.pending: deque[tuple[ShardItem, int]] = deque()
        self.owners: dict[int, ShardItem] = {}
        self.admitted = 0
        self.open = True

    def take(self, room: int) -> list[tuple[Any, int]] | None:
        if self.open and len(self.pending) < room:
            wanted = -(-(room - len(self.pending)) // self.group_size)
            items = self.items.take(wanted)
            if items is None:
                self.open = False
            for item in items or ():
                self.pending.extend((item, index) for index in item.rollout_indices(self.group_size))
        if not self.pending:
            return None if not self.open else []
        jobs = [self.pending.popleft() for _ in range(min(room, len(self.pending)))]
        for item, _ in jobs:
            self.owners[self.admitted] = item
            self.admitted += 1
        return [(item.task, index) for item, index in jobs]


@dataclasses.dataclass(frozen=True)
class ProducerConfig:
    """group_size: G rollouts per task; seed: the run seed the sampling seeds derive from."""

    group_size: int = 4
    tool_reward_coef: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")


class GroupProducer:
    """Generates and scores the groups of shard items with one engine and sandbox pool."""

    def __init__(
        self,
        config: ProducerConfig,
        *,
        engine: Engine,
        tokenizer: Any,
        sandboxes: SandboxSource,
        episode: EpisodeConfig = EpisodeConfig(),
        sampling: SamplingParams = SamplingParams(),
        routes: ScorerRoutes = ScorerRoutes(),
    ):
        self.config = config
        self.engine, self.tokenizer, self.sandboxes = engine, tokenizer, sandboxes
        self.episode, self.sampling, self.routes = episode, sampling, routes

    def produce(self, items: Sequence[ShardItem], stop: threading.Event | None = None) -> list[TrajectoryGroup]:
        """One scored group per item, in item order; raises `agent.runner.Abandoned` when
        `stop` is set first."""
        if not items:
            return []
        size = self.config.group_size
        first = items[0]
        sampling = dataclasses.replace(self.sampling, seed=derived_seed(self.config.seed, first.epoch, first.position))
        runner = EpisodeRunner(self.engine, self.tokenizer, self.sandboxes, self.episode, sampling)
        jobs = [(item.task, index) for item in items for index in item.rollout_indices(size)]
        trajectories = runner.run_trajectories(jobs, stop=stop)
        if len(trajectories) != len(jobs):
            raise RuntimeError(f"{len(trajectories)} of {len(jobs)} episodes finished")
        groups = [
            TrajectoryGroup(item.task, tuple(trajectories[i * size : (i + 1) * size])) for i, item in enumerate(items)
        ]
        return score_groups(groups, self.tokenizer, self.config.tool_reward_coef, self.routes)

    def stream(
        self, items: ItemFeed, max_concurrent: int | None = None, poll_s: float = 0.5
    ) -> Iterator[tuple[ShardItem, TrajectoryGroup]]:
        """(item, scored group) as each item's G episodes finish, in completion order.

        Episodes of many items run together (up to `max_concurrent` in flight, default the
        episode config's); a finished episode's place goes to the next job at once, so no
        group waits for another. Every request's randomness comes from the run seed and its
        request id (task and rollout index), so a group does not depend on what it ran beside.
        """
        size = self.config.group_size
        sampling = dataclasses.replace(self.sampling, seed=derived_seed(self.config.seed, 0, 0))
        episode = (
            self.episode if max_concurrent is None else dataclasses.replace(self.episode, max_concurrent=max_concurrent)
        )
        runner = EpisodeRunner(self.engine, self.tokenizer, self.sandboxes, episode, sampling)
        jobs = _GroupJobs(items, size)
        partial: dict[int, list[Trajectory]] = {}
        for position, trajectory in runner.stream(jobs, poll_s=poll_s):
            item = jobs.owners.pop(position)
            done = partial.setdefault(id(item), [])
            done.append(trajectory)
            if len(done) == size:
                del partial[id(item)]
                done.sort(key=lambda t: t.rollout_index)
                group = TrajectoryGroup(item.task, tuple(done))
                yield item, score_groups([group], self.tokenizer, self.config.tool_reward_coef, self.routes)[0]
