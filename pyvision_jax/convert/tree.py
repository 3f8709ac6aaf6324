"""Nested-dict params trees (as ``nnx.State.to_pure_dict`` gives them): flattening, building,
and where each leaf is placed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

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
