"""Masked per-group statistics over padded [P, G] arrays."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class GroupStatistics(NamedTuple):
    """Per-group statistics, each [P]; groups with no member give 0 everywhere."""

    count: jax.Array
    """Number of members included (int32)."""
    mean: jax.Array
    std: jax.Array
    """Population standard deviation (divides by count)."""
    unbiased_std: jax.Array
    """Sample standard deviation (divides by count - 1; 0 when count < 2)."""


def usable_mask(valid: jax.Array, broken: jax.Array) -> jax.Array:
    """Members that count for statistics: real rollouts that did not break."""
    return jnp.asarray(valid, bool) & ~jnp.asarray(broken, bool)


def group_statistics(rewards: jax.Array, mask: jax.Array) -> GroupStatistics:
    """Mean, population std and unbiased std of `rewards` over the members where `mask` holds.

    Values are centred on one member (the largest) before summing, so a group whose members
    are all equal gets exactly zero deviations and std, whatever float rounding the sum of
    its raw values would have produced.
    """
    mask = jnp.asarray(mask, bool)
    rewards = jnp.asarray(rewards, jnp.float32)
    anchor = jnp.where(mask, rewards, -jnp.inf).max(axis=-1)
    anchor = jnp.where(mask.any(axis=-1), anchor, 0.0)
    centred = jnp.where(mask, rewards - anchor[:, None], 0.0)
    count = mask.sum(axis=-1).astype(jnp.float32)
    centred_mean = centred.sum(axis=-1) / jnp.maximum(count, 1.0)
    deviation = jnp.where(mask, centred - centred_mean[:, None], 0.0)
    squared = jnp.square(deviation).sum(axis=-1)
    std = jnp.sqrt(squared / jnp.maximum(count, 1.0))
    unbiased_std = jnp.where(count > 1, jnp.sqrt(squared / jnp.maximum(count - 1.0, 1.0)), 0.0)
    return GroupStatistics(
        count=count.astype(jnp.int32), mean=anchor + centred_mean, std=std, unbiased_std=unbiased_std
    )
