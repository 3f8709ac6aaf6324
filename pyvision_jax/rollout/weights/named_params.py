"""A model params tree from the (HF tensor name, HF-layout array) pairs a checkpoint or a
weight transport yields, and new weights checked and cast like the engine's current params,
as ``JaxEngine.update_weights`` takes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.convert.names import TensorKind, hub_name, is_tied_lm_head, tensor_kind
from pyvision_jax.convert.tree import stack_tensors
from pyvision_jax.models import ModelConfig, unstack_layers


def params_from_named(config: ModelConfig, named: Iterable[tuple[str, Any]]) -> dict:
    """A params tree from (Hub or transformers-v5 name, HF-layout array) pairs (numpy or torch);
    missing or unknown tensors raise."""
    hf_config = hf_config_dict(config)
    tensors: dict[str, np.ndarray] = {}
    for name, array in named:
        if is_tied_lm_head(name, hf_config):
            continue
        array = np.asarray(array.detach().cpu().float().numpy() if hasattr(array, "detach") else array)
        kind = tensor_kind(hub_name(name))
        if kind is TensorKind.LINEAR_WEIGHT:
            array = array.T
        elif kind is TensorKind.CONV_WEIGHT:
            array = array.reshape(array.shape[0], -1).T
        tensors[name] = array
    try:
        return stack_tensors(tensors, hf_config)
    except ValueError as error:
        raise ValueError(f"update_weights: {error}") from None


def params_like(config: ModelConfig, weights: Any, current: Any) -> Any:
    """`weights` (a params tree, or (HF name, array) pairs) as a tree like `current`: the same
    structure and shapes (checked, naming the leaf), cast to its dtypes and placed where its
    leaves are. Where `current` holds the decoder layers apart (``models.unstack_layers``, the
    JAX engine's form), so do the result's."""
    if not isinstance(weights, Mapping):
        weights = params_from_named(config, weights)
    if isinstance(current["model"]["layers"], tuple):
        weights = unstack_layers(weights)
    if jax.tree.structure(weights) != jax.tree.structure(current):
        raise ValueError(
            "update_weights: the new weights' tree differs from the engine's "
            f"params: {jax.tree.structure(weights)} vs {jax.tree.structure(current)}"
        )

    def convert(path: Any, new: Any, old: jax.Array) -> jax.Array:
        if tuple(np.shape(new)) != old.shape:
            raise ValueError(
                f"update_weights: {jax.tree_util.keystr(path)} has shape "
                f"{tuple(np.shape(new))}, the engine's params {old.shape}"
            )
        value = jnp.asarray(new, old.dtype)
        # a committed array where the old leaf was not (or vice versa) would recompile
        return jax.device_put(value, old.sharding) if old.committed else value

    return jax.tree_util.tree_map_with_path(convert, weights, current)
