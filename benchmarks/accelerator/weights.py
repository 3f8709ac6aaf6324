"""Random weights made on the device in one compiled program (eager Flax initialisation
dispatches every op of every module, seconds even for a tiny model)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pyvision_jax.models import ModelConfig, param_shapes

WEIGHT_STD = 0.02


def random_params(config: ModelConfig, dtype: str, seed: int = 0, shardings: Any = None) -> dict:
    """Params of `config` in `dtype`: norm scales 1, every other leaf normal with std
    WEIGHT_STD (O(1) activations through the residual stream); placed by `shardings`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(config))

    def make() -> dict:
        keys = jax.random.split(jax.random.key(seed), len(flat))
        leaves = [jnp.ones(shape.shape, dtype) if jax.tree_util.keystr(path).endswith("['scale']")
                  else WEIGHT_STD * jax.random.normal(key, shape.shape, dtype) for key, (path, shape) in zip(keys, flat)]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    return jax.jit(make, out_shardings=shardings)()
