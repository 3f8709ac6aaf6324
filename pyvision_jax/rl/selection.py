"""Oversample-filter-rank: choose the rollout groups that train this step.

Works on padded [P, G] arrays (P prompt groups, G rollouts each) and returns a fixed number
of indices so the result has a static shape under `jax.jit`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from pyvision_jax.rl.group_stats import group_statistics, usable_mask

SelectionMode = Literal["group", "trajectory"]
RankBy = Literal["std", "arrival"]
BatchUnit = Literal["groups", "rollouts"]
BATCH_UNITS = ("groups", "rollouts")


class SelectionCounts(NamedTuple):
    """Counts for metrics (int32 scalars). The five group outcomes partition `groups`."""

    groups: jax.Array
    """Groups with at least one valid rollout."""
    broken_groups_dropped: jax.Array
    """Groups dropped because a rollout broke (only with `drop_groups_with_broken`)."""
    too_few_members: jax.Array
    """Groups with fewer than `min_members` usable rollouts (valid ones with
    `stats_include_broken`)."""
    zero_variance: jax.Array
    """Groups whose reward std over usable rollouts is <= `std_eps`."""
    no_trainable: jax.Array
    """Informative groups left with no trainable rollout (every usable one dropped by the
    rollout filters, or every rollout broken when `stats_include_broken`)."""
    eligible: jax.Array
    """Groups that passed every filter."""
    broken_rollouts: jax.Array
    """Valid rollouts marked broken."""
    kept: jax.Array
    """Real selected items: groups in group mode, trajectories in trajectory mode."""
    trainable: jax.Array
    """Selected rollouts that train (the batch's real rows)."""
    available: jax.Array
    """Rollouts of eligible groups that would train: what the pool offers the batch."""
    filtered: jax.Array
    """Usable rollouts of eligible groups that the rollout filters (`keep`) drop."""


class Selection(NamedTuple):
    indices: jax.Array
    """[num_select] int32: group indices (group mode) or flat rollout indices p * G + g
    (trajectory mode), best first; [P] ranked group indices in group mode with batch_unit
    "rollouts". Entries past the real ones are filler."""
    real: jax.Array
    """Same shape as `indices`: which entries are real selections."""
    rollout_indices: jax.Array
    """[R] int32 flat rollout indices p * G + g of everything selected (R = num_select * G in
    group mode, num_select in trajectory mode); gather with `take_selected`."""
    rollout_real: jax.Array
    """[R] bool: the rollout is selected and trains (valid, not broken, kept by the rollout
    filters)."""
    counts: SelectionCounts


def select_rollouts(
    rewards: jax.Array,
    valid: jax.Array,
    broken: jax.Array,
    num_select: int,
    *,
    keep: jax.Array | None = None,
    mode: SelectionMode = "group",
    batch_unit: BatchUnit = "groups",
    rank_by: RankBy = "std",
    std_eps: float = 1e-6,
    min_members: int = 2,
    drop_groups_with_broken: bool = False,
    stats_include_broken: bool = False,
) -> Selection:
    """Drop uninformative groups and rollouts, rank the rest by reward std (descending), keep the top.

    A group is dropped when it has no valid rollout (padding), when it holds a broken rollout
    and `drop_groups_with_broken` is set, when fewer than `min_members` of its rollouts are
    usable (valid and not broken), when the std of its usable rewards is <= `std_eps`, or
    when none of its rollouts trains. A rollout trains when it is usable and `keep` (the
    per-rollout filters, [P, G] bool; default all) holds. The filters act before ranking:
    a dropped rollout or a group left without one never takes a place in the batch. The
    group statistics (std, mean, member count) are those of the whole group, before the
    rollout filters.

    mode="group" (default) ranks whole groups by the population std of their usable rewards,
    ties to the lower group index. With batch_unit="groups" it returns `num_select` group
    indices and their G rows each (a rollout that does not train is a masked row). With
    batch_unit="rollouts" the batch is num_select * G rows of trainable rollouts: groups are
    taken in rank order, each with its trainable rollouts only, skipping a group that no
    longer fits whole, until no room is left.
    mode="trajectory" reproduces the official implementation: every trainable rollout of a
    surviving group is ranked by its group's unbiased std, ties to the lower flat index, and
    `num_select` single rollouts are returned (so a group may be split at the cut).

    `rank_by="arrival"` (an ablation) keeps the informative groups (or rollouts) in the order
    they arrived instead of by std.

    `stats_include_broken=True` reproduces the released code: the std and the member count
    (for `min_members`) are over every valid rollout, broken ones included (they still never
    train). By default they are over usable rollouts only.

    `num_select`, `mode`, `batch_unit`, `rank_by`, `min_members`, `drop_groups_with_broken`
    and `stats_include_broken` are static under jit.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    valid = jnp.asarray(valid, bool)
    broken = jnp.asarray(broken, bool)
    num_groups, group_size = rewards.shape
    if mode not in ("group", "trajectory"):
        raise ValueError(f"select_rollouts: mode must be 'group' or 'trajectory', got {mode!r}")
    if batch_unit not in BATCH_UNITS:
        raise ValueError(f"select_rollouts: batch_unit must be one of {BATCH_UNITS}, got {batch_unit!r}")
    if rank_by not in ("std", "arrival"):
        raise ValueError(f"select_rollouts: rank_by must be 'std' or 'arrival', got {rank_by!r}")
    capacity = num_groups if mode == "group" else num_groups * group_size
    if not 1 <= num_select <= capacity:
        raise ValueError(
            f"select_rollouts: num_select={num_select} must be in [1, {capacity}] for "
            f"mode={mode!r} and rewards of shape {rewards.shape}"
        )

    usable = usable_mask(valid, broken)
    trains = usable if keep is None else usable & jnp.asarray(keep, bool)
    stats = group_statistics(rewards, valid if stats_include_broken else usable)
    has_member = valid.any(axis=-1)
    valid_broken = valid & broken
    if drop_groups_with_broken:
        dropped_broken = has_member & valid_broken.any(axis=-1)
    else:
        dropped_broken = jnp.zeros_like(has_member)
    remaining = has_member & ~dropped_broken
    too_few = remaining & (stats.count < min_members)
    remaining = remaining & ~too_few
    zero_variance = remaining & (stats.std <= std_eps)
    remaining = remaining & ~zero_variance
    no_trainable = remaining & ~trains.any(axis=-1)
    eligible = remaining & ~no_trainable

    if mode == "group":
        order = stats.std if rank_by == "std" else -jnp.arange(num_groups, dtype=jnp.float32)
        key = jnp.where(eligible, order, -jnp.inf)
        if batch_unit == "groups":
            _, indices = jax.lax.top_k(key, num_select)
            real = eligible[indices]
            rollout_indices = (indices[:, None] * group_size + jnp.arange(group_size)[None, :]).reshape(-1)
            rollout_real = (real[:, None] & trains[indices]).reshape(-1)
        else:
            indices, real, rollout_indices, rollout_real = _fill_rows(key, eligible, trains, num_select * group_size)
    else:
        trainable = (eligible[:, None] & trains).reshape(-1)
        order = (
            jnp.repeat(stats.unbiased_std, group_size)
            if rank_by == "std"
            else -jnp.arange(num_groups * group_size, dtype=jnp.float32)
        )
        key = jnp.where(trainable, order, -jnp.inf)
        _, indices = jax.lax.top_k(key, num_select)
        real = trainable[indices]
        rollout_indices, rollout_real = indices, real

    def total(mask: jax.Array) -> jax.Array:
        return mask.sum(dtype=jnp.int32)

    counts = SelectionCounts(
        groups=total(has_member),
        broken_groups_dropped=total(dropped_broken),
        too_few_members=total(too_few),
        zero_variance=total(zero_variance),
        no_trainable=total(no_trainable),
        eligible=total(eligible),
        broken_rollouts=total(valid_broken),
        kept=total(real),
        trainable=total(rollout_real),
        available=total(eligible[:, None] & trains),
        filtered=total(eligible[:, None] & usable & ~trains),
    )
    return Selection(
        indices=indices.astype(jnp.int32),
        real=real,
        rollout_indices=rollout_indices.astype(jnp.int32),
        rollout_real=rollout_real,
        counts=counts,
    )


def _fill_rows(
    key: jax.Array, eligible: jax.Array, trains: jax.Array, rows: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Group mode, batch_unit "rollouts": (ranked group indices [P], taken [P], rollout
    indices [rows], real [rows]). Groups are visited best first; one is taken when its
    trainable rollouts fit in the rows left, and they fill the next rows."""
    num_groups, group_size = trains.shape
    _, ranked = jax.lax.top_k(key, num_groups)
    sizes = trains.sum(axis=-1, dtype=jnp.int32)[ranked]

    def fit(room: jax.Array, item: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        size, ok = item
        take = ok & (size <= room)
        return room - jnp.where(take, size, 0), take

    _, taken = jax.lax.scan(fit, jnp.int32(rows), (sizes, eligible[ranked]))
    members = (taken[:, None] & trains[ranked]).reshape(-1)
    flat = (ranked[:, None] * group_size + jnp.arange(group_size)[None, :]).reshape(-1)
    target = jnp.where(members, jnp.cumsum(members) - 1, rows)
    rollout_indices = jnp.zeros(rows, jnp.int32).at[target].set(flat.astype(jnp.int32), mode="drop")
    rollout_real = jnp.zeros(rows, bool).at[target].set(True, mode="drop")
    return ranked, taken, rollout_indices, rollout_real


def take_selected(values: jax.Array, selection: Selection) -> jax.Array:
    """Gather per-rollout data [P, G, ...] into the selected rollouts [R, ...]."""
    flat = values.reshape((values.shape[0] * values.shape[1],) + values.shape[2:])
    return jnp.take(flat, selection.rollout_indices, axis=0)
