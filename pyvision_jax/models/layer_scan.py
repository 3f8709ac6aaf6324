"""Stacked layers: built once with a leading "layers" axis and run with one `lax.scan`.

A stack of L identical modules is created with `nnx.vmap`, so every parameter gains a
leading axis of size L carrying the logical name "layers" (see models/sharding.py). The
forward pass splits the stack into (graphdef, state) and scans over the state: XLA compiles
one layer body whatever the depth, and the remat policy decides which of the body's
intermediate values the backward pass keeps (the rest it recomputes).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import jax
from flax import nnx

Carry = TypeVar("Carry")

REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_all_dots": jax.checkpoint_policies.dots_saveable,
}
"""Remat policy names: "none" keeps every intermediate (no recomputation); "full" keeps only
each layer's input; "save_dots" keeps the outputs of weight matmuls (projections, MLP),
recomputing attention and elementwise work; "save_all_dots" keeps attention matmuls too."""


def check_remat(policy: str, field: str = "remat") -> str:
    """`policy` if it is a known remat policy name, else a ValueError naming `field`."""
    if policy not in REMAT_POLICIES:
        raise ValueError(f"{field}={policy!r} is not a remat policy; choose one of {sorted(REMAT_POLICIES)}")
    return policy


def stacked(count: int, make: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs) -> nnx.Module:
    """`count` modules of `make(rngs)` as one module whose parameters have a leading
    "layers" axis (independent random initialisation per layer)."""

    @nnx.split_rngs(splits=count)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(layer_rngs: nnx.Rngs) -> nnx.Module:
        return make(layer_rngs)

    return create(rngs)


def scan_layers(
    layers: nnx.Module,
    body: Callable[[nnx.Module, Carry, Any], tuple[Carry, Any]],
    carry: Carry,
    xs: Any = None,
    remat: str = "none",
) -> tuple[Carry, Any]:
    """Runs `body(layer, carry, x) -> (carry, y)` over the stacked `layers` (and `xs`, each
    with the same leading axis), rematerialising each layer according to `remat`."""
    graphdef, state = nnx.split(layers)

    def step(carry: Carry, args: tuple[Any, Any]) -> tuple[Carry, Any]:
        layer_state, x = args
        return body(nnx.merge(graphdef, layer_state), carry, x)

    if check_remat(remat) != "none":
        step = jax.checkpoint(step, policy=REMAT_POLICIES[remat], prevent_cse=False)
    return jax.lax.scan(step, carry, (state, xs))
