"""A model params tree from the (HF tensor name, HF-layout array) pairs a checkpoint or a
weight transport yields, as ``JaxEngine.update_weights`` takes them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from pyvision_jax.convert.names import (
    TensorKind,
    hub_name,
    is_tied_lm_head,
    tensor_kind,
)
from pyvision_jax.convert.tree import stack_tensors
from pyvision_jax.models import ModelConfig


def params_from_named(config: ModelConfig, named: Iterable[tuple[str, Any]]) -> dict:
    """A params tree from (Hub or transformers-v5 name, HF-layout array) pairs (numpy or torch);
    missing or unknown tensors raise."""
    hf_config = config.to_hf_dict()
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
