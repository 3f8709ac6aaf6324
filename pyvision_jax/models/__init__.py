"""Qwen2.5-VL in Flax NNX: vision tower, text decoder, M-RoPE position ids, sharding rules."""

from pyvision_jax.models.config import ModelConfig, ModelConfigError, VisionConfig
from pyvision_jax.models.kv_cache import KVCache
from pyvision_jax.models.qwen2_5_vl import (
    ModelInputs,
    Qwen2_5_VL,
    decode_step,
    forward,
    graphdef,
    init_params,
    logits,
    param_logical_axes,
    param_shapes,
    params_sharding,
    prefill,
    prepare_inputs,
    stack_layers,
    unstack_layers,
)
from pyvision_jax.models.rope_index import decode_position_ids, rope_index, rope_index_for

__all__ = [
    "ModelConfig",
    "ModelConfigError",
    "VisionConfig",
    "ModelInputs",
    "Qwen2_5_VL",
    "KVCache",
    "decode_step",
    "forward",
    "graphdef",
    "init_params",
    "logits",
    "param_logical_axes",
    "param_shapes",
    "params_sharding",
    "prefill",
    "prepare_inputs",
    "stack_layers",
    "unstack_layers",
    "decode_position_ids",
    "rope_index",
    "rope_index_for",
]
