"""Benchmark weights made on the device by one small compiled program.

Flax's own initialisation (`init_params`) dispatches or compiles a random draw per module,
seconds even for the tiny model; here every leaf is an integer hash of its element index,
an elementwise kernel that compiles in well under a second at any size. The values are
uniform with a fixed standard deviation: they set the timing and memory of a step, not
anything it learns.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from pyvision_jax.models import ModelConfig, param_shapes

WEIGHT_STD = 0.02


def hashed_uniform(shape: tuple[int, ...], salt: int, dtype: str, std: float) -> jax.Array:
    """Pseudo-random values, uniform in [-std sqrt(3), std sqrt(3)], from a hash of each
    element's index (and `salt`)."""
    n = jax.lax.iota(jnp.uint32, max(1, math.prod(shape))) * jnp.uint32(2654435761)
    n = n + jnp.uint32(salt * 40503 + 1)
    n = (n ^ (n >> 15)) * jnp.uint32(2246822519)
    n = n ^ (n >> 13)
    unit = (n >> 8).astype(jnp.float32) * (2.0**-24) - 0.5
    return (unit * (std * 12**0.5)).reshape(shape).astype(dtype)


def random_params(config: ModelConfig, dtype: str, shardings: Any = None) -> dict:
    """Params of `config` in `dtype`: norm scales 1, every other leaf `hashed_uniform` with
    std WEIGHT_STD; placed by `shardings` (default: the default device)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(config))

    def make() -> dict:
        leaves = [
            jnp.ones(shape.shape, dtype)
            if jax.tree_util.keystr(path).endswith("['scale']")
            else hashed_uniform(shape.shape, salt, dtype, WEIGHT_STD)
            for salt, (path, shape) in enumerate(flat)
        ]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    return jax.jit(make, out_shardings=shardings)()
