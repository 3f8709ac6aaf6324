"""Qwen2 text decoder in Flax NNX: GQA with q/k/v biases, M-RoPE, SwiGLU, and a KV cache.

The KV cache has a fixed number of slots. Every call writes its tokens at `cache.index`
(the same slot for all rows, so prompts are left-padded or right-padded into one block) and
marks them valid with the call's attention mask; a query attends to valid slots up to its
own. Padding therefore never changes the logits of real tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pyvision_jax.models.attention import attention, query_groups
from pyvision_jax.models.blockwise_attention import MASK_VALUE
from pyvision_jax.models.config import ModelConfig
from pyvision_jax.models.kv_cache import KVCache, LayerCache
from pyvision_jax.models.layer_scan import REMAT_POLICIES, check_remat, scan_layers, stacked
from pyvision_jax.models.sharding import linear, shard_activation
from pyvision_jax.models.vision import RMSNorm, apply_rotary


def mrope_cos_sin(
    positions: jax.Array, head_dim: int, theta: float, mrope_section: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
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


def cached_gqa_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """q [B, T, H, d] against one layer's cached keys [B, KVH, d, S] and values [B, KVH, S, d],
    mask [B, T, S] -> [B, T, H, d]; fp32 softmax."""
    b, t, h, d = q.shape
    scores = jnp.einsum("bkgtd,bkds->bkgts", query_groups(q, keys.shape[1]), keys, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores * scale, MASK_VALUE), axis=-1)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs.astype(values.dtype), values)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class TextAttention(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads, hd)
        self.attention = config.attention
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.q_proj = linear(d, self.num_heads * hd, ("embed", "heads"), use_bias=True, **kw)
        self.k_proj = linear(d, self.num_kv_heads * hd, ("embed", "kv_heads"), use_bias=True, **kw)
        self.v_proj = linear(d, self.num_kv_heads * hd, ("embed", "kv_heads"), use_bias=True, **kw)
        self.o_proj = linear(self.num_heads * hd, d, ("heads", "embed"), use_bias=False, **kw)

    def project(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q [B, T, H, d], k and v [B, T, KVH, d] of `x`, rotary applied."""
        b, t, _ = x.shape
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        # In the compute dtype, as transformers does: fp32 rotary tables would otherwise
        # promote q and k (and the attention's saved inputs) to fp32 under bf16 compute.
        q = apply_rotary(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim), cos, sin).astype(v.dtype)
        k = apply_rotary(self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim), cos, sin).astype(v.dtype)
        return q, k, v

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array) -> jax.Array:
        """Causal attention within segments (no cache): [B, T, H, d]."""
        return attention(q, k, v, segments, segments, causal=True, scale=self.head_dim**-0.5, config=self.attention)

    def __call__(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, cached: "LayerCache | None" = None
    ):
        """`mask`: segment ids [B, T] without a cache, the [B, T, S] cache mask with one."""
        b, t, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if cached is None:
            out = self.attend(q, k, v, mask)
        else:
            cached = cached.write(k, v)
            keys, values = cached.keys.astype(q.dtype), cached.values.astype(q.dtype)
            out = cached_gqa_attention(q, keys, values, mask, self.head_dim**-0.5)
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
    return (
        d_x.astype(x.dtype),
        (rows(x).T @ rows(d_gate)).astype(w_gate.dtype),
        (rows(x).T @ rows(d_up)).astype(w_up.dtype),
        (rows(hidden).T @ rows(d_out)).astype(w_down.dtype),
    )


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
        return swiglu_mlp(x.astype(dtype), kernel(self.gate_proj), kernel(self.up_proj), kernel(self.down_proj))


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = TextAttention(config, **kw)
        self.mlp = TextMLP(config, **kw)

    def __call__(self, x, cos, sin, mask, cached=None, remat: str = "none"):
        if cached is None and check_remat(remat) != "none":
            return self._rematerialised(x, cos, sin, mask, REMAT_POLICIES[remat]), None
        attn, cached = self.self_attn(self.input_layernorm(x), cos, sin, mask, cached)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cached

    def _rematerialised(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, segments: jax.Array, policy: Any
    ) -> jax.Array:
        """The layer with the remat `policy` on everything but the attention kernel, whose
        custom gradient already recomputes block by block and keeps only its output and
        logsumexp. (Under remat inside the layer scan JAX would differentiate the kernel's
        forward loops and keep every block's scores: quadratic memory.)"""
        attn = self.self_attn
        q, k, v = jax.checkpoint(lambda x: attn.project(self.input_layernorm(x), cos, sin), policy=policy)(x)
        out = attn.attend(q, k, v, segments)

        def finish(x: jax.Array, out: jax.Array) -> jax.Array:
            x = x + attn.o_proj(out.reshape(*out.shape[:2], -1))
            return x + self.mlp(self.post_attention_layernorm(x))

        return jax.checkpoint(finish, policy=policy)(x, out)


class TextModel(nnx.Module):
    """`model.*` of the Hub checkpoint: embed_tokens, layers, norm."""

    def __init__(
        self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any = jnp.float32, dtype: Any = jnp.float32
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.hidden_size,
            rngs=rngs,
            param_dtype=param_dtype,
            dtype=dtype,
            embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed")),
        )
        self.layers = stacked(
            config.num_hidden_layers,
            lambda layer_rngs: DecoderLayer(config, rngs=layer_rngs, param_dtype=param_dtype, dtype=dtype),
            rngs,
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)

    def __call__(
        self,
        embeds: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        cache: KVCache | None = None,
        segment_ids: jax.Array | None = None,
        remat: str = "none",
        layer_weights: Sequence[Any] | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """embeds [B, T, D], positions [3, B, T], attention_mask [B, T] -> normed hidden [B, T, D].

        Without a cache, `segment_ids` [B, T] (packed rows: one id > 0 per trajectory) keep
        attention within each segment; by default each row is one segment. `remat` is the
        layer scan's remat policy (models/layer_scan.py). With a cache, the layers run one by one,
        each on its own cache arrays, from `layer_weights` when given (see `layer_list`)."""
        cfg = self.config
        t = embeds.shape[1]
        cos, sin = mrope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
        attention_mask = attention_mask.astype(bool)
        if cache is None:
            if layer_weights is not None:
                raise ValueError("per-layer weights are for cached decoding; the cacheless pass scans the stack")
            segments = (
                attention_mask.astype(jnp.int32)
                if segment_ids is None
                else jnp.where(attention_mask, segment_ids.astype(jnp.int32), 0)
            )

            def layer_step(layer: DecoderLayer, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
                x = shard_activation(x, ("batch", "length", "act_embed"))
                return layer(x, cos, sin, segments, remat=remat)[0], None

            x, _ = scan_layers(self.layers, layer_step, embeds)
            return self.norm(x), None
        index = cache.index
        valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask, (0, index))
        query_slot = index + jnp.arange(t)
        key_slot = jnp.arange(cache.max_length)
        mask = (key_slot[None, :] <= query_slot[:, None])[None] & valid[:, None, :]
        x, keys, values = embeds, [], []
        for layer, layer_keys, layer_values in zip(self.layer_list(layer_weights), cache.keys, cache.values):
            x, written = layer(x, cos, sin, mask, LayerCache(layer_keys, layer_values, index))
            keys.append(written.keys)
            values.append(written.values)
        return self.norm(x), KVCache(keys=tuple(keys), values=tuple(values), valid=valid, index=index + t)

    def layer_list(self, layer_weights: Sequence[Any] | None = None) -> list[DecoderLayer]:
        """The decoder layers one by one: from `layer_weights` (each layer's pure params, held
        apart so that no step slices them out of the stacked arrays, which copies them) or
        else sliced from the stack."""
        graphdef, state = nnx.split(self.layers)
        if layer_weights is None:
            return [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)) for i in range(len(self))]
        if len(layer_weights) != len(self):
            raise ValueError(f"{len(layer_weights)} layers' weights for a model of {len(self)} layers")
        layers = []
        for weights in layer_weights:
            layer_state = jax.tree.map(lambda x: x, state)
            nnx.replace_by_pure_dict(layer_state, weights)
            layers.append(nnx.merge(graphdef, layer_state))
        return layers

    def __len__(self) -> int:
        return self.config.num_hidden_layers
