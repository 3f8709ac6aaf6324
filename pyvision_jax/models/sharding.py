"""Logical axis names on parameters and the rules that map them to mesh axes.

Every parameter is created with a tuple of logical axis names (see `param`), stored as nnx
sharding metadata; stacked layers add a leading "layers" axis (replicated: each device holds
its fsdp shard of every layer). A rules table maps each logical name to mesh axes among
`data`, `fsdp`, `tensor`; a mesh axis is dropped for a dimension it does not divide, so the
same model and rules run on one device or on any mesh. Activations are constrained along
logical axes too (`shard_activation`), under the mesh set with `jax.set_mesh`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or axes, or None for replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("norm", None),
    ("vit_patch", None),
    ("vit_embed", "fsdp"),
    ("vit_qkv", "tensor"),
    ("vit_heads", "tensor"),
    ("vit_mlp", "tensor"),
    ("vit_merge", "fsdp"),
    ("layers", None),
    # activations
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("vit_windows", ("data", "fsdp")),
)


def param(
    initializer: Callable, rngs: nnx.Rngs, shape: Sequence[int], dtype: Any, axes: tuple[str | None, ...]
) -> nnx.Param:
    """A parameter annotated with logical axis names (one per dimension)."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {axes} do not match parameter shape {tuple(shape)}")
    return nnx.Param(initializer(rngs.params(), tuple(shape), dtype), out_sharding=axes, eager_sharding=False)


def linear(
    din: int,
    dout: int,
    axes: tuple[str | None, str | None],
    *,
    use_bias: bool,
    rngs: nnx.Rngs,
    param_dtype: Any,
    dtype: Any,
) -> nnx.Linear:
    """nnx.Linear whose kernel [din, dout] (and bias [dout]) carry logical axis names."""
    inits = {"kernel_init": nnx.with_partitioning(nnx.initializers.normal(0.02), axes)}
    if use_bias:
        inits["bias_init"] = nnx.with_partitioning(nnx.initializers.zeros_init(), (axes[1],))
    return nnx.Linear(din, dout, use_bias=use_bias, rngs=rngs, param_dtype=param_dtype, dtype=dtype, **inits)


def shard_activation(
    x: jax.Array, axes: tuple[str | None, ...], rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES
) -> jax.Array:
    """`x` constrained to the sharding of its logical `axes` on the current mesh
    (`jax.set_mesh`); unchanged when no mesh is set."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, mesh_partition_spec(axes, x.shape, mesh, rules))


def logical_axes(state: nnx.State) -> Any:
    """Pure nested dict of logical axis-name tuples, mirroring `state.to_pure_dict()`."""

    def names(variable: nnx.Variable) -> tuple:
        meta = variable.get_metadata()
        axes = meta.get("out_sharding") or meta.get("sharding_names")
        return tuple(axes) if axes else (None,) * jnp.ndim(variable.get_value())

    specs = jax.tree.map(names, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(specs) if isinstance(specs, nnx.State) else specs


def mesh_partition_spec(
    axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES
) -> PartitionSpec:
    """Resolve logical names to mesh axes; drop mesh axes that are absent, reused or do not divide."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        target = table.get(name) if name is not None else None
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        chosen, size = [], 1
        for axis in targets:
            if axis in mesh.shape and axis not in used and dim % (size * mesh.shape[axis]) == 0:
                chosen.append(axis)
                size *= mesh.shape[axis]
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    return PartitionSpec(*spec)


def param_shardings(
    axes_tree: Any, params: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES
) -> Any:
    """NamedSharding per parameter, from the logical axes tree and the params (or their shapes).

    The mesh should have Auto axis types (`jax.make_mesh(..., axis_types=(AxisType.Auto,) * 3)`):
    the model leaves the placement of activations to the compiler.
    """
    return jax.tree.map(
        lambda axes, x: NamedSharding(mesh, mesh_partition_spec(axes, x.shape, mesh, rules)),
        axes_tree,
        params,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def batch_sharding(
    mesh: Mesh,
    ndim: int,
    batch_axis: int = 0,
    batch_size: int | None = None,
    rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES,
) -> NamedSharding:
    """Sharding for an input array whose `batch_axis` is the batch (other dims replicated)."""
    axes = [None] * ndim
    axes[batch_axis] = "batch"
    shape = [1] * ndim
    shape[batch_axis] = batch_size if batch_size is not None else _mesh_size(mesh)
    return NamedSharding(mesh, mesh_partition_spec(axes, shape, mesh, rules))


def _mesh_size(mesh: Mesh) -> int:
    size = 1
    for n in mesh.shape.values():
        size *= n
    return size
