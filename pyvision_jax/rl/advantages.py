"""Group-relative advantages over padded [P, G] arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pyvision_jax.rl.group_stats import group_statistics, usable_mask


def group_advantages(
    rewards: jax.Array,
    valid: jax.Array,
    broken: jax.Array,
    *,
    normalize_std: bool = False,
    std_eps: float = 1e-6,
    mean_over_full_group: bool = False,
    negative_weight: float = 1.0,
) -> jax.Array:
    """A = r - mean(group), optionally divided by (unbiased std + std_eps); 0 where unusable;
    negative advantages are then multiplied by `negative_weight` (1: the recipe).

    The baseline is computed over the usable members (valid and not broken) by default, i.e.
    after filtering. `mean_over_full_group=True` reproduces the official implementation, which
    computes it over every valid rollout of the group before broken ones are filtered out.
    The normalizing std (GRPO's; off in the PyVision-RL recipe) is the unbiased one, over the
    same members as the mean. Static under jit: `normalize_std`, `mean_over_full_group`.

    `negative_weight` < 1 damps the push away from failed rollouts. In a peaked policy a
    negative advantage lowers a sampled sequence's probability by spreading its mass over
    every other token, while a positive one can barely raise a sequence that is already
    likely, so at equal weight the update raises entropy where the rollouts disagree
    (measured on the small model: one step moves failed rollouts by -1.5 nats, successful
    ones by +0.2).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    usable = usable_mask(valid, broken)
    members = jnp.asarray(valid, bool) if mean_over_full_group else usable
    stats = group_statistics(rewards, members)
    advantages = rewards - stats.mean[:, None]
    if normalize_std:
        advantages = advantages / (stats.unbiased_std[:, None] + std_eps)
    advantages = jnp.where(advantages < 0, advantages * negative_weight, advantages)
    return jnp.where(usable, advantages, 0.0)
