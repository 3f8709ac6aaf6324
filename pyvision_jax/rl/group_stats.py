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
    """Mean, population std and unbiased std of `rewards` over the members where `mask` holds."""
    mask = jnp.asarray(mask, bool)
    rewards = jnp.where(mask, jnp.asarray(rewards, jnp.float32), 0.0)
    count = mask.sum(axis=-1).astype(jnp.float32)
    mean = rewards.sum(axis=-1) / jnp.maximum(count, 1.0)
    squared = jnp.where(mask, jnp.square(rewards - mean[:, None]), 0.0).sum(axis=-1)
    std = jnp.sqrt(squared / jnp.maximum(count, 1.0))
    unbiased_std = jnp.where(count > 1, jnp.sqrt(squared / jnp.maximum(count - 1.0, 1.0)), 0.0)
    return GroupStatistics(count=count.astype(jnp.int32), mean=mean, std=std, unbiased_std=unbiased_std)
