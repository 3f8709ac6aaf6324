"""From trajectory groups to the rows of a train batch: score, reward, select, advantages.

Groups become padded [P, G] arrays (the RL kernels' contract); `select_rollouts` (jitted,
static P and G) drops zero-variance and broken groups, ranks the rest by reward std and
keeps B; advantages are r - mean(group). Rows that are not selected come back as None
(padding: trained on with no loss).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from pyvision_jax.agent.trajectory import EndReason, Trajectory, TrajectoryGroup
from pyvision_jax.rl import accumulative_tool_reward, group_advantages, select_rollouts
from pyvision_jax.rl.selection import SelectionCounts
from pyvision_jax.grading.trajectory import score_trajectory
from pyvision_jax.train import metrics as names


@dataclasses.dataclass(frozen=True)
class ScoredGroups:
    """Groups and their [P, G] arrays; rows past len(groups) (or past a group's size) are padding."""

    groups: tuple[TrajectoryGroup, ...]
    rewards: np.ndarray
    scores: np.ndarray
    correct: np.ndarray
    valid: np.ndarray
    broken: np.ndarray

    def trajectory(self, flat_index: int, group_size: int) -> Trajectory | None:
        p, g = divmod(int(flat_index), group_size)
        if p >= len(self.groups) or g >= len(self.groups[p].trajectories):
            return None
        return self.groups[p].trajectories[g]


@dataclasses.dataclass(frozen=True)
class SelectedRows:
    rows: list[Trajectory | None]
    advantages: np.ndarray
    counts: SelectionCounts


def score_groups(groups: Sequence[TrajectoryGroup], group_size: int, capacity: int, tokenizer: Any,
                 tool_reward_coef: float) -> ScoredGroups:
    """[capacity, group_size] arrays for `groups` (capacity >= len(groups) keeps shapes static)."""
    if len(groups) > capacity:
        raise ValueError(f"{len(groups)} groups exceed the capacity {capacity}")
    shape = (capacity, group_size)
    scores, correct = np.zeros(shape, np.float32), np.zeros(shape, bool)
    valid, broken = np.zeros(shape, bool), np.zeros(shape, bool)
    tool_calls = np.zeros(shape, np.float32)
    for p, group in enumerate(groups):
        if len(group.trajectories) > group_size:
            raise ValueError(f"group of task {group.task.id} has {len(group.trajectories)} rollouts, "
                             f"more than rl.group_size={group_size}")
        for g, trajectory in enumerate(group.trajectories):
            score = score_trajectory(trajectory, group.task, tokenizer)
            scores[p, g], correct[p, g] = score.score, score.correct
            valid[p, g] = True
            broken[p, g] = trajectory.broken
            tool_calls[p, g] = trajectory.num_successful_tool_calls
    rewards = np.asarray(accumulative_tool_reward(scores, correct, tool_calls, valid, tool_reward_coef))
    return ScoredGroups(tuple(groups), rewards, scores, correct, valid, broken)


@functools.partial(jax.jit, static_argnames=("num_select", "mode", "min_members", "drop_groups_with_broken",
                                             "normalize_std"))
def _select(rewards, valid, broken, *, num_select, mode, min_members, drop_groups_with_broken, normalize_std):
    selection = select_rollouts(rewards, valid, broken, num_select, mode=mode, min_members=min_members,
                                drop_groups_with_broken=drop_groups_with_broken)
    advantages = group_advantages(rewards, valid, broken, normalize_std=normalize_std)
    flat = advantages.reshape(-1)[selection.rollout_indices]
    return selection, flat


def select_rows(scored: ScoredGroups, num_groups: int, group_size: int, *, mode: str = "group",
                min_members: int = 2, drop_groups_with_broken: bool = False,
                normalize_std: bool = False) -> SelectedRows:
    """The top `num_groups` groups (or `num_groups * group_size` trajectories in trajectory
    mode) as batch rows with their advantages; unselected slots are None with advantage 0."""
    num_select = num_groups if mode == "group" else num_groups * group_size
    selection, advantages = _select(scored.rewards, scored.valid, scored.broken, num_select=num_select,
                                    mode=mode, min_members=min_members,
                                    drop_groups_with_broken=drop_groups_with_broken, normalize_std=normalize_std)
    indices = np.asarray(selection.rollout_indices)
    real = np.asarray(selection.rollout_real)
    advantages = np.where(real, np.asarray(advantages), 0.0).astype(np.float32)
    rows = [scored.trajectory(i, group_size) if r else None for i, r in zip(indices, real)]
    counts = SelectionCounts(*(int(x) for x in selection.counts))
    return SelectedRows(rows, advantages, counts)


def rollout_scalars(scored: ScoredGroups, counts: SelectionCounts) -> dict[str, float]:
    """Reward, tool, length, visual-token, end-reason and filter scalars over every rollout drawn."""
    trajectories = [t for g in scored.groups for t in g.trajectories]
    valid = scored.valid
    num = max(len(trajectories), 1)

    def mean(values: Sequence[float]) -> float:
        return float(np.sum(values)) / num

    out = {
        names.REWARD_TOTAL: float(scored.rewards[valid].sum()) / num,
        names.REWARD_ACCURACY: float(scored.correct[valid].sum()) / num,
        names.TOOLS_CALLS_PER_TRAJ: mean([t.num_tool_calls for t in trajectories]),
        names.RESPONSE_LENGTH: mean([t.num_generated_tokens for t in trajectories]),
        names.VISUAL_TOKENS_PER_TRAJ: mean([t.num_visual_tokens for t in trajectories]),
        names.FILTER_ZERO_VARIANCE_FRAC: counts.zero_variance / max(counts.groups, 1),
        names.FILTER_BROKEN_FRAC: counts.broken_rollouts / num,
        names.FILTER_GROUPS_KEPT: float(counts.kept),
    }
    for reason in EndReason:
        out[names.end_reason_tag(reason.value)] = mean([t.end_reason is reason for t in trajectories])
    return out
