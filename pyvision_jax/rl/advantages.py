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
) -> jax.Array:
    """A = r - mean(group), optionally divided by (unbiased std + std_eps); 0 where unusable.

    The baseline is computed over the usable members (valid and not broken) by default, i.e.
    after filtering. `mean_over_full_group=True` reproduces the official implementation, which
    computes it over every valid rollout of the group before broken ones are filtered out.
    The normalizing std (GRPO's; off in the PyVision-RL recipe) is the unbiased one, over the
    same members as the mean. Static under jit: `normalize_std`, `mean_over_full_group`.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    usable = usable_mask(valid, broken)
    members = jnp.asarray(valid, bool) if mean_over_full_group else usable
    stats = group_statistics(rewards, members)
    advantages = rewards - stats.mean[:, None]
    if normalize_std:
        advantages = advantages / (stats.unbiased_std[:, None] + std_eps)
    return jnp.where(usable, advantages, 0.0)
