"""Qwen2.5-VL in Flax NNX: vision tower, text decoder, M-RoPE position ids, sharding rules."""

from pyvision_jax.models.config import ModelConfig, ModelConfigError, VisionConfig
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
)
from pyvision_jax.models.rope_index import decode_position_ids, rope_index, rope_index_for
from pyvision_jax.models.text import KVCache

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
    "decode_position_ids",
    "rope_index",
    "rope_index_for",
]
