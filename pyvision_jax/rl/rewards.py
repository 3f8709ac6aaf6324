"""Accumulative tool reward over padded [P, G] group arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def accumulative_tool_reward(
    score: jax.Array, correct: jax.Array, num_tool_calls: jax.Array, valid: jax.Array, coef: float = 0.1
) -> jax.Array:
    """R = score + coef * num_tool_calls * 1[correct], and 0 on padding.

    Tool calls earn nothing on a wrong answer, so the bonus rewards using tools to get
    answers right rather than calling tools for their own sake. All inputs are [P, G].
    """
    score = jnp.asarray(score, jnp.float32)
    bonus = coef * jnp.asarray(num_tool_calls, jnp.float32) * jnp.asarray(correct, jnp.float32)
    return jnp.where(jnp.asarray(valid, bool), score + bonus, 0.0)
