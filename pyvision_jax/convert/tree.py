"""Nested-dict params trees (as ``nnx.State.to_pure_dict`` gives them): flattening, building,
and where each leaf is placed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from pyvision_jax.convert import names
from pyvision_jax.convert.names import ParamPath

Params = dict[str | int, Any]
ShardingSpec = jax.sharding.Sharding | Mapping | Callable[[ParamPath, tuple[int, ...]], Any] | None


def flatten_params(params: Mapping) -> dict[ParamPath, Any]:
    """``{path: leaf}`` of a nested-dict params tree."""
    flat: dict[ParamPath, Any] = {}

    def visit(node: Any, prefix: ParamPath) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                visit(child, (*prefix, key))
        else:
            flat[prefix] = node

    visit(params, ())
    return flat


def set_leaf(tree: Params, path: ParamPath, value: Any) -> None:
    """Stores ``value`` at ``path``, creating the intermediate dicts."""
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def leaf_sharding(sharding: ShardingSpec, path: ParamPath, shape: tuple[int, ...]) -> Any:
    """The sharding of one leaf: ``None``, one Sharding for all leaves, a params-shaped tree
    of shardings, or ``fn(path, shape) -> Sharding``."""
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        return sharding
    if isinstance(sharding, Mapping):
        node: Any = sharding
        for key in path:
            node = node[key]
        return node
    return sharding(path, shape)


def _cpu_device() -> jax.Device | None:
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return None


def host_copy(leaf: Any) -> np.ndarray:
    """The value of one leaf as a numpy array, without leaving a cached copy behind.

    ``np.asarray(jax_array)`` stores its host copy on the array (for accelerator or sharded
    arrays) until the array dies, which during an export would keep a second copy of the
    whole model on the host; shards are fetched through temporary CPU arrays instead.
    """
    if not isinstance(leaf, jax.Array):
        return np.asarray(leaf)
    if not leaf.is_fully_addressable:
        raise ValueError(
            f"array of shape {leaf.shape} spans devices of other processes; gather it first "
            "(jax.experimental.multihost_utils.process_allgather)"
        )
    cpu = _cpu_device()
    out = None
    for shard in leaf.addressable_shards:
        if shard.replica_id != 0:
            continue
        data = np.asarray(jax.device_put(shard.data, cpu)) if cpu is not None else np.array(shard.data)
        if data.shape == leaf.shape:
            return data
        if out is None:
            out = np.empty(leaf.shape, leaf.dtype)
        out[shard.index] = data
    return out


def stack_tensors(tensors: Mapping[str, Any], hf_config: Mapping[str, Any]) -> Params:
    """A params tree from Flax-layout arrays keyed by Hub (or v5) tensor name: a stacked
    leaf is its layers' arrays stacked. Raises a ValueError naming missing and unknown tensors."""
    by_name = {names.hub_name(name): array for name, array in tensors.items()}
    leaves = names.param_leaves(hf_config)
    expected = {name for spec in leaves.values() for name in spec.tensors}
    missing = sorted(expected - set(by_name))
    unknown = sorted(set(by_name) - expected)
    if missing or unknown:
        raise ValueError(f"tensors do not match the checkpoint: missing {missing[:5]}, unknown {unknown[:5]}")
    params: Params = {}
    for path, spec in leaves.items():
        value = np.stack([np.asarray(by_name[n]) for n in spec.tensors]) if spec.stacked else by_name[spec.tensors[0]]
        set_leaf(params, path, value)
    return params
