"""Reward controls: the recipe with the reward's information removed, to tell what the reward
teaches from what any update of the same size and entropy does.

- "random": every rollout's reward is replaced by a Bernoulli(0.5) draw, so groups are
  selected and advantages computed exactly as in the recipe but carry no information about
  the answers. Each group's draws depend only on (seed, the group's seed), so a group drawn
  again, or a resumed run, gets the same rewards.
- "entropy_min": no policy-gradient term (every advantage is 0); the update is the loss's
  entropy term alone (a negative `rl.entropy_coef` minimises the token entropy). Groups are
  still selected by the real reward's std.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

REWARD_CONTROLS = ("", "random", "entropy_min")


def check_reward_control(control: str) -> None:
    if control not in REWARD_CONTROLS:
        raise ValueError(f"rl.reward_control must be one of {REWARD_CONTROLS} ('' is the recipe), got {control!r}")


def random_rewards(seed: int | jax.Array, group_seeds: jax.Array, valid: jax.Array) -> jax.Array:
    """[P, G] float32 Bernoulli(0.5) rewards where `valid` [P, G], 0 elsewhere; row p draws from
    a key of (seed, group_seeds[p])."""
    valid = jnp.asarray(valid, bool)
    base = jax.random.PRNGKey(seed)
    keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(group_seeds, jnp.uint32))
    draws = jax.vmap(lambda key: jax.random.bernoulli(key, 0.5, (valid.shape[1],)))(keys)
    return jnp.where(valid, draws.astype(jnp.float32), 0.0)


def controlled_rewards(
    control: str, rewards: jax.Array, valid: jax.Array, seed: int | jax.Array, group_seeds: jax.Array
) -> jax.Array:
    """The rewards that selection and advantages see under `control` (static)."""
    check_reward_control(control)
    if control == "random":
        return random_rewards(seed, group_seeds, valid)
    return jnp.asarray(rewards, jnp.float32)


def controlled_advantages(control: str, advantages: jax.Array) -> jax.Array:
    """The advantages the loss sees under `control` (static): 0 everywhere for "entropy_min"."""
    check_reward_control(control)
    advantages = jnp.asarray(advantages, jnp.float32)
    return jnp.zeros_like(advantages) if control == "entropy_min" else advantages
