"""Where a ``JaxEngine`` keeps its weights and KV caches.

An executable is compiled for its arguments' placements as well as their shapes: uncommitted
weights, and committed ones that the trainer sends later, would each get their own; weights on
a one-device mesh and a checkpoint's weights would not share persistent-cache keys."""

from __future__ import annotations

from typing import Any

import jax


def placements(params: Any) -> tuple[Any, jax.sharding.Sharding | None]:
    """The engine's weights committed where they will stay, and the sharding of its KV caches.

    Weights on one device (a checkpoint's, or a one-device trainer mesh's) go to that device
    as plain single-device arrays, so that every engine over the same shapes compiles the same
    executables (a later engine loads them from the persistent compilation cache) and a
    trainer's committed updates run on them. Weights over several devices stay as they are;
    the caches are replicated over their mesh (None, left to jit, where they have no mesh)."""
    leaves = jax.tree.leaves(params)
    devices = set().union(*(leaf.sharding.device_set for leaf in leaves))
    if len(devices) == 1:
        device = jax.sharding.SingleDeviceSharding(devices.pop())
        return jax.device_put(params, device), device
    sharding = leaves[0].sharding
    cache = (
        jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
        if isinstance(sharding, jax.sharding.NamedSharding)
        else None
    )
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), params), cache
