"""Qwen2 text decoder in Flax NNX: GQA with q/k/v biases, M-RoPE, SwiGLU, and a KV cache.

The KV cache has a fixed number of slots. Every call writes its tokens at `cache.index`
(the same slot for all rows, so prompts are left-padded or right-padded into one block) and
marks them valid with the call's attention mask; a query attends to valid slots up to its
own. Padding therefore never changes the logits of real tokens.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from pyvision_jax.models.config import ModelConfig
from pyvision_jax.models.sharding import linear
from pyvision_jax.models.vision import MASK_VALUE, RMSNorm, apply_rotary


@struct.dataclass
class KVCache:
    """Per-layer keys/values [B, kv_heads, S, head_dim], slot validity [B, S], next write slot.

    Heads-major, as attention reads them: a decode step then attends to the cache as it is,
    with no per-step transpose of every layer's keys and values."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array

    @classmethod
    def init(cls, config: ModelConfig, batch: int, max_length: int, dtype: Any = jnp.float32) -> "KVCache":
        shape = (batch, config.num_key_value_heads, max_length, config.head_dim)
        zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers))
        return cls(keys=zeros, values=tuple(jnp.zeros(shape, dtype) for _ in zeros),
                   valid=jnp.zeros((batch, max_length), bool), index=jnp.zeros((), jnp.int32))

    @property
    def max_length(self) -> int:
        return self.valid.shape[1]


def mrope_cos_sin(positions: jax.Array, head_dim: int, theta: float,
                  mrope_section: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """cos/sin [B, T, 1, head_dim] for 3-D positions [3, B, T] (chunked mrope layout).

    Rotary frequency i (of head_dim/2) takes its position from the temporal, height or width
    axis according to which `mrope_section` chunk it falls in; the half is then repeated.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    axis_of_freq = np.repeat(np.arange(3), mrope_section)
    pos = positions.astype(jnp.float32)[axis_of_freq]  # [head_dim/2, B, T]
    freqs = jnp.moveaxis(pos, 0, -1) * inv_freq  # [B, T, head_dim/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return jnp.cos(emb), jnp.sin(emb)


CAUSAL_QUERY_BLOCK = 256
"""Queries per block of `causal_gqa_attention`: block i only reads keys up to its own end."""


def _scores_softmax(q: jax.Array, k: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    return jax.nn.softmax(jnp.where(mask[:, None, None], scores, MASK_VALUE), axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Heads-major q [B, KVH, G, T, d], k/v [B, KVH, S, d], mask [B, T, S] -> [B, KVH, G, T, d].

    The hand-written gradient reads the [.., T, S] probabilities fewer times than autodiff
    of the softmax does: dS = P * (dP - rowsum(dO * O)), masked entries zeroed.
    """
    return _attend_forward(q, k, v, mask, scale)[0]


def _attend_forward(q, k, v, mask, scale):
    probs = _scores_softmax(q, k, mask, scale)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs.astype(v.dtype), v)
    return out, (q, k, v, mask, probs, out)


def _attend_backward(scale, residuals, d_out):
    q, k, v, mask, probs, out = residuals
    d_v = jnp.einsum("bkgts,bkgtd->bksd", probs.astype(d_out.dtype), d_out)
    d_probs = jnp.einsum("bkgtd,bksd->bkgts", d_out, v, preferred_element_type=jnp.float32)
    row = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scores = (jnp.where(mask[:, None, None], probs * (d_probs - row), 0.0) * scale).astype(q.dtype)
    d_q = jnp.einsum("bkgts,bksd->bkgtd", d_scores, k)
    d_k = jnp.einsum("bkgts,bkgtd->bksd", d_scores, q)
    return d_q, d_k, d_v, None


_attend.defvjp(_attend_forward, _attend_backward)


def _query_groups(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, H, d] -> [B, KVH, G, T, d], the G query heads sharing each kv head."""
    b, t, h, d = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)


def _heads_major(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _query_groups(q, k.shape[2]), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def cached_gqa_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                         scale: float) -> jax.Array:
    """q [B, T, H, d], heads-major cached k/v [B, KVH, S, d], mask [B, T, S] -> [B, T, H, d];
    fp32 softmax."""
    b, t, h, d = q.shape
    out = _attend(_query_groups(q, k.shape[1]), k, v, mask, scale)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def causal_gqa_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                         query_block: int = CAUSAL_QUERY_BLOCK) -> jax.Array:
    """Grouped-query attention, q [B, T, H, d], k/v [B, T, KVH, d] -> [B, T, H, d] with an
    fp32 softmax, for self-attention under a causal mask (mask[:, t, s] false for s > t).

    Heads-major inside, so the batched matmuls and their gradients need no transposes of the
    [.., T, S] scores. Each block of queries skips the keys after its last query, which the
    mask hides anyway, so about half of the score work is not done. A query whose keys are
    all masked averages the values up to its block's end instead of all of them."""
    b, t, h, d = q.shape
    qg, kh, vh = _heads_major(q, k, v)
    outs = []
    for start in range(0, t, query_block):
        end = min(start + query_block, t)
        outs.append(_attend(qg[:, :, :, start:end], kh[:, :, :end], vh[:, :, :end],
                            mask[:, start:end, :end], scale))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class TextAttention(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads,
                                                            config.num_key_value_heads, hd)
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.q_proj = linear(d, self.num_heads * hd, ("embed", "heads"), use_bias=True, **kw)
        self.k_proj = linear(d, self.num_kv_heads * hd, ("embed", "kv_heads"), use_bias=True, **kw)
        self.v_proj = linear(d, self.num_kv_heads * hd, ("embed", "kv_heads"), use_bias=True, **kw)
        self.o_proj = linear(self.num_heads * hd, d, ("heads", "embed"), use_bias=False, **kw)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                 cached: tuple[jax.Array, jax.Array] | None = None, index: jax.Array | None = None):
        b, t, _ = x.shape
        q = apply_rotary(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        scale = self.head_dim**-0.5
        if cached is None:
            out = causal_gqa_attention(q, k, v, mask, scale)
        else:
            start = (0, 0, index, 0)
            write = lambda cache, new: jax.lax.dynamic_update_slice(
                cache, new.transpose(0, 2, 1, 3).astype(cache.dtype), start)
            cached = (write(cached[0], k), write(cached[1], v))
            out = cached_gqa_attention(q, cached[0].astype(q.dtype), cached[1].astype(q.dtype),
                                       mask, scale)
        return self.o_proj(out.reshape(b, t, -1)), cached


@jax.custom_vjp
def swiglu_mlp(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """down(silu(x @ w_gate) * (x @ w_up)) for x [..., D], kernels [D, F], [D, F], [F, D].

    The hand-written gradient computes the elementwise products of the backward pass
    (the gate and up gradients) in their natural [tokens, F] layout behind an optimization
    barrier: left to autodiff, XLA:CPU fuses them into transposing copies feeding the
    weight-gradient matmuls, which cost about a fifth of the train step
    (benchmarks/train_step.py).
    """
    return _swiglu_forward(x, w_gate, w_up, w_down)[0]


def _swiglu_forward(x, w_gate, w_up, w_down):
    gate, up = x @ w_gate, x @ w_up
    return (jax.nn.silu(gate) * up) @ w_down, (x, w_gate, w_up, w_down, gate, up)


def _swiglu_backward(residuals, d_out):
    x, w_gate, w_up, w_down, gate, up = residuals
    sigmoid = jax.nn.sigmoid(gate)
    act = gate * sigmoid
    d_hidden = d_out @ w_down.T
    d_up = d_hidden * act
    d_gate = d_hidden * up * (sigmoid * (1 + gate * (1 - sigmoid)))
    hidden, d_up, d_gate = jax.lax.optimization_barrier((act * up, d_up, d_gate))
    rows = lambda t: t.reshape(-1, t.shape[-1])
    d_x = d_up @ w_up.T + d_gate @ w_gate.T
    return (d_x.astype(x.dtype), (rows(x).T @ rows(d_gate)).astype(w_gate.dtype),
            (rows(x).T @ rows(d_up)).astype(w_up.dtype),
            (rows(hidden).T @ rows(d_out)).astype(w_down.dtype))


swiglu_mlp.defvjp(_swiglu_forward, _swiglu_backward)


class TextMLP(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        d, f = config.hidden_size, config.intermediate_size
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.gate_proj = linear(d, f, ("embed", "mlp"), use_bias=False, **kw)
        self.up_proj = linear(d, f, ("embed", "mlp"), use_bias=False, **kw)
        self.down_proj = linear(f, d, ("mlp", "embed"), use_bias=False, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.gate_proj.dtype or x.dtype
        kernel = lambda proj: proj.kernel[...].astype(dtype)
        return swiglu_mlp(x.astype(dtype), kernel(self.gate_proj), kernel(self.up_proj),
                          kernel(self.down_proj))


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = TextAttention(config, **kw)
        self.mlp = TextMLP(config, **kw)

    def __call__(self, x, cos, sin, mask, cached=None, index=None):
        attn, cached = self.self_attn(self.input_layernorm(x), cos, sin, mask, cached, index)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cached


class TextModel(nnx.Module):
    """`model.*` of the Hub checkpoint: embed_tokens, layers, norm."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any = jnp.float32,
                 dtype: Any = jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size, config.hidden_size, rngs=rngs, param_dtype=param_dtype, dtype=dtype,
            embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed")))
        self.layers = nnx.List([DecoderLayer(config, **kw) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)

    def __call__(self, embeds: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
        """embeds [B, T, D], positions [3, B, T], attention_mask [B, T] -> normed hidden [B, T, D]."""
        cfg = self.config
        b, t, _ = embeds.shape
        cos, sin = mrope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
        attention_mask = attention_mask.astype(bool)
        if cache is None:
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = causal[None] & attention_mask[:, None, :]
            index = None
        else:
            index = cache.index
            valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask, (0, index))
            query_slot = index + jnp.arange(t)
            key_slot = jnp.arange(cache.max_length)
            mask = (key_slot[None, :] <= query_slot[:, None])[None] & valid[:, None, :]
        x = embeds
        new_keys, new_values = [], []
        for layer_index, layer in enumerate(self.layers):
            cached = None if cache is None else (cache.keys[layer_index], cache.values[layer_index])
            x, cached = layer(x, cos, sin, mask, cached, index)
            if cached is not None:
                new_keys.append(cached[0])
                new_values.append(cached[1])
        if cache is not None:
            cache = KVCache(keys=tuple(new_keys), values=tuple(new_values), valid=valid, index=index + t)
        return self.norm(x), cache
