"""From scored trajectory groups to the rows of a train batch: pool, select, advantages.

The groups of one step's pool become padded [P, G] arrays of the scores stored on them when
they were produced (the RL kernels' contract; G is the groups' size, P the pool's static
capacity); advantages are r - mean(group), the mean over the group's usable rollouts (every
valid one with `stats_include_broken`) before any rollout filter. The rollout filters (the
released recipe's, off by default) mark the rollouts whose end reason is not in
`train_end_reasons` or that never showed an image produced by code; then `select_rollouts`
(jitted) drops zero-variance and broken groups and the filtered rollouts, ranks what is left
by reward std and keeps B groups (or fills B * G rows, `batch_unit` "rollouts"), so a
dropped rollout, or a group left without one, never takes a place in the batch. Rows that
are not selected come back as None (padding: trained on with no loss). A rollout is broken
when its episode broke or its grading failed (`GroupScores.broken`). Nothing here scores an
answer. Under a reward control (`rl.controls`) selection and advantages see the control's
rewards and advantages; the logged rewards stay the real ones.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Sequence

import jax
import numpy as np

from pyvision_jax.agent.trajectory import EndReason, Trajectory, TrajectoryGroup
from pyvision_jax.rl import controlled_advantages, controlled_rewards, group_advantages, select_rollouts
from pyvision_jax.rl.controls import check_reward_control
from pyvision_jax.rl.selection import BATCH_UNITS, SelectionCounts
from pyvision_jax.run_logs import metric_names as tags


@dataclasses.dataclass(frozen=True)
class GroupPool:
    """Groups and their [capacity, G] arrays; rows past len(groups) (or past a group's size)
    are padding."""

    groups: tuple[TrajectoryGroup, ...]
    rewards: np.ndarray
    correct: np.ndarray
    valid: np.ndarray
    broken: np.ndarray
    group_seeds: np.ndarray
    """[capacity] uint32: a checksum of each group's key (0 on padding), what the random
    reward control draws from."""

    @property
    def group_size(self) -> int:
        return int(self.rewards.shape[1])

    def trajectory(self, flat_index: int) -> Trajectory | None:
        p, g = divmod(int(flat_index), self.group_size)
        if p >= len(self.groups) or g >= len(self.groups[p].trajectories):
            return None
        return self.groups[p].trajectories[g]


@dataclasses.dataclass(frozen=True)
class SelectedRows:
    rows: list[Trajectory | None]
    advantages: np.ndarray
    counts: SelectionCounts
    filtered: int = 0
    """Usable rollouts of informative groups that the rollout filters dropped."""
    full: bool = False
    """The pool fills the batch: B groups (group mode, batch_unit "groups"), or at least
    B * G trainable rollouts in its informative groups (batch_unit "rollouts", trajectory
    mode; whole groups may leave a few rows empty); else another generation round may add
    to it."""


def pool_arrays(groups: Sequence[TrajectoryGroup], capacity: int, group_size: int) -> GroupPool:
    """[capacity, group_size] arrays of the stored rewards (capacity >= len(groups) and a fixed
    group size keep the kernels' shapes static from step to step)."""
    if len(groups) > capacity:
        raise ValueError(f"{len(groups)} groups exceed the pool capacity {capacity}")
    shape = (capacity, group_size)
    rewards, correct = np.zeros(shape, np.float32), np.zeros(shape, bool)
    valid, broken = np.zeros(shape, bool), np.zeros(shape, bool)
    group_seeds = np.zeros(capacity, np.uint32)
    for p, group in enumerate(groups):
        if group.scores is None:
            raise ValueError(f"group {group.key} arrived unscored: groups are scored once, by their producer")
        if len(group) > group_size:
            raise ValueError(f"group {group.key} has {len(group)} rollouts, more than rl.group_size={group_size}")
        size = len(group)
        rewards[p, :size] = group.scores.rewards
        correct[p, :size] = group.scores.correct
        valid[p, :size] = True
        broken[p, :size] = [t.broken or failed for t, failed in zip(group.trajectories, group.scores.broken)]
        group_seeds[p] = zlib.crc32(group.key.encode())
    return GroupPool(tuple(groups), rewards, correct, valid, broken, group_seeds)


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_select",
        "mode",
        "batch_unit",
        "rank_by",
        "min_members",
        "drop_groups_with_broken",
        "normalize_std",
        "stats_include_broken",
        "negative_weight",
        "reward_control",
    ),
)
def _select(
    rewards,
    valid,
    broken,
    keep,
    group_seeds,
    control_seed,
    *,
    num_select,
    mode,
    batch_unit,
    rank_by,
    min_members,
    drop_groups_with_broken,
    normalize_std,
    stats_include_broken,
    negative_weight,
    reward_control,
):
    rewards = controlled_rewards(reward_control, rewards, valid, control_seed, group_seeds)
    selection = select_rollouts(
        rewards,
        valid,
        broken,
        num_select,
        keep=keep,
        mode=mode,
        batch_unit=batch_unit,
        rank_by=rank_by,
        min_members=min_members,
        drop_groups_with_broken=drop_groups_with_broken,
        stats_include_broken=stats_include_broken,
    )
    advantages = group_advantages(
        rewards,
        valid,
        broken,
        normalize_std=normalize_std,
        mean_over_full_group=stats_include_broken,
        negative_weight=negative_weight,
    )
    flat = controlled_advantages(reward_control, advantages.reshape(-1)[selection.rollout_indices])
    return selection, flat


@dataclasses.dataclass(frozen=True)
class SelectionConfig:
    """How a pool becomes a batch: the top `batch_groups` groups (or `batch_groups * G`
    trajectories in "trajectory" mode), ranked by reward std (rank_by="std") or taken in
    arrival order ("arrival", an ablation). batch_unit (group mode): "groups" (ours: B
    groups of G rows each, a rollout that does not train is a masked row) or "rollouts"
    (released: B * G rows of trainable rollouts, filled with whole groups in rank order).
    stats_include_broken: group statistics, the advantage mean and `min_members` over every
    valid rollout (released) instead of the usable ones. train_end_reasons (empty: all) and
    require_code_image: the rollout filters, applied after advantages and before ranking
    (released: DONE, EXCEED_MAX_TURNS, ERROR_IN_ACTION; True). negative_weight: the factor
    on negative advantages (1: the recipe; see `rl.advantages.group_advantages`).
    reward_control: "" (the recipe), "random" or "entropy_min" (`rl.controls`, config key
    rl.reward_control); control_seed seeds the random rewards."""

    batch_groups: int = 2
    mode: str = "group"
    batch_unit: str = "groups"
    rank_by: str = "std"
    min_members: int = 2
    drop_groups_with_broken: bool = False
    normalize_std: bool = False
    stats_include_broken: bool = False
    train_end_reasons: tuple[EndReason, ...] = ()
    require_code_image: bool = False
    negative_weight: float = 1.0
    reward_control: str = ""
    control_seed: int = 0

    def __post_init__(self) -> None:
        check_reward_control(self.reward_control)
        if self.batch_unit not in BATCH_UNITS:
            raise ValueError(f"rl.batch_unit must be one of {BATCH_UNITS}, got {self.batch_unit!r}")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise ValueError(f"rl.negative_weight={self.negative_weight} must be in [0, 1]")
        try:
            reasons = tuple(EndReason(r) for r in self.train_end_reasons)
        except ValueError as err:
            raise ValueError(
                f"rl.train_end_reasons: {err}; expected names from {[r.value for r in EndReason]}"
            ) from None
        object.__setattr__(self, "train_end_reasons", reasons)

    def trains(self, trajectory: Trajectory) -> bool:
        """Whether a rollout passes the rollout filters."""
        if self.train_end_reasons and trajectory.end_reason not in self.train_end_reasons:
            return False
        return not self.require_code_image or any(im.source == "code" for im in trajectory.images)


def select_rows(pool: GroupPool, config: SelectionConfig) -> SelectedRows:
    """The selected trajectories as batch rows with their advantages; unselected slots are
    None with advantage 0."""
    num_select = config.batch_groups if config.mode == "group" else config.batch_groups * pool.group_size
    selection, advantages = _select(
        pool.rewards,
        pool.valid,
        pool.broken,
        pool_filter(pool, config),
        pool.group_seeds,
        np.uint32(config.control_seed),
        num_select=num_select,
        mode=config.mode,
        batch_unit=config.batch_unit,
        rank_by=config.rank_by,
        min_members=config.min_members,
        drop_groups_with_broken=config.drop_groups_with_broken,
        normalize_std=config.normalize_std,
        stats_include_broken=config.stats_include_broken,
        negative_weight=config.negative_weight,
        reward_control=config.reward_control,
    )
    indices, real = np.asarray(selection.rollout_indices), np.asarray(selection.rollout_real)
    rows = [pool.trajectory(i) if r else None for i, r in zip(indices, real)]
    advantages = np.where(real, np.asarray(advantages), 0.0).astype(np.float32)
    counts = SelectionCounts(*(int(x) for x in selection.counts))
    if config.mode == "group" and config.batch_unit == "groups":
        full = counts.kept == config.batch_groups
    else:
        full = counts.available >= config.batch_groups * pool.group_size
    return SelectedRows(rows, advantages, counts, counts.filtered, full)


def pool_filter(pool: GroupPool, config: SelectionConfig) -> np.ndarray:
    """[capacity, G] bool: the rollouts that pass the rollout filters (padding: False)."""
    keep = np.zeros(pool.rewards.shape, bool)
    for p, group in enumerate(pool.groups):
        keep[p, : len(group)] = [config.trains(t) for t in group.trajectories]
    return keep


def rollout_scalars(pool: GroupPool, counts: SelectionCounts) -> dict[str, float]:
    """Reward, tool, length, visual-token, end-reason and filter scalars over every rollout drawn."""
    trajectories = [t for g in pool.groups for t in g.trajectories]
    num = max(len(trajectories), 1)

    def mean(values: Sequence[float]) -> float:
        return float(np.sum(values)) / num

    out = {
        tags.REWARD_TOTAL: float(pool.rewards[pool.valid].sum()) / num,
        tags.REWARD_ACCURACY: float(pool.correct[pool.valid].sum()) / num,
        tags.TOOLS_CALLS_PER_TRAJ: mean([t.num_tool_calls for t in trajectories]),
        tags.RESPONSE_LENGTH: mean([t.num_generated_tokens for t in trajectories]),
        tags.VISUAL_TOKENS_PER_TRAJ: mean([t.num_visual_tokens for t in trajectories]),
        tags.FILTER_ZERO_VARIANCE_FRAC: counts.zero_variance / max(counts.groups, 1),
        tags.FILTER_BROKEN_FRAC: counts.broken_rollouts / num,
        tags.FILTER_GROUPS_KEPT: float(counts.kept),
    }
    for reason in EndReason:
        out[tags.end_reason_tag(reason.value)] = mean([t.end_reason is reason for t in trajectories])
    for bucket in tags.TOOL_CALL_SHARE_BUCKETS:
        out[tags.tool_call_share_tag(bucket)] = mean(
            [tags.tool_call_share_tag(t.num_tool_calls) == tags.tool_call_share_tag(bucket) for t in trajectories]
        )
    return out
