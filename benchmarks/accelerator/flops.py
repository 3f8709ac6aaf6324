"""Model FLOPs of the train step and of attention, and the chips' peak rates.

Conventions (the usual MFU ones): a matmul of an [m, k] by a [k, n] operand costs 2 m k n;
the backward pass costs twice the forward pass; recomputation (remat) is not counted, so
the figure is model FLOPs, not hardware FLOPs. Attention is counted on the (query, key)
pairs a causal query really sees within its segment, L (L + 1) / 2 per segment of L tokens,
not on the padded T x T square.
"""

from __future__ import annotations

from typing import Sequence

from pyvision_jax.models import ModelConfig

PEAK_BF16_FLOPS = (
    ("H200", 989.4e12),
    ("H100", 989.4e12),
    ("GH200", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("TPU v6", 918e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 197e12),
    ("TPU v4", 275e12),
)
"""Dense bf16 peak by device kind (datasheet figures, the first matching name wins): NVIDIA
SXM parts and Google's TPU generations."""


def peak_flops(device_kind: str) -> float | None:
    """The datasheet's dense bf16 FLOP/s of a device kind, None when unknown (e.g. a CPU)."""
    for name, flops in PEAK_BF16_FLOPS:
        if name.lower() in device_kind.lower():
            return flops
    return None


def layer_matmul_params(config: ModelConfig) -> int:
    """Weights one decoder layer multiplies each token by: q, k, v, o projections and the MLP."""
    d, hd = config.hidden_size, config.head_dim
    attention = d * hd * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    return attention + 3 * d * config.intermediate_size


def causal_pairs(segment_lengths: Sequence[int]) -> int:
    """(query, key) pairs causal attention computes over packed segments."""
    return sum(n * (n + 1) // 2 for n in segment_lengths)


def attention_flops(heads: int, head_dim: int, pairs: int, backward: bool = True) -> float:
    """Scores and weighted values: 2 matmuls of 2 FLOPs per pair, head and dimension; x3 with
    the backward pass."""
    forward = 4.0 * heads * head_dim * pairs
    return 3 * forward if backward else forward


def train_step_flops(config: ModelConfig, layers: int, segment_lengths: Sequence[int]) -> float:
    """Model FLOPs of one train step (forward and backward) of a text-only packed batch whose
    segments have `segment_lengths` tokens in all, through `layers` decoder layers and the
    lm_head."""
    tokens = sum(segment_lengths)
    dense = 6.0 * tokens * (layers * layer_matmul_params(config) + config.hidden_size * config.vocab_size)
    return dense + layers * attention_flops(config.num_attention_heads, config.head_dim, causal_pairs(segment_lengths))
