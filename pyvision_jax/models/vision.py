"""Qwen2.5-VL vision tower in Flax NNX, with a shape-static layout for many images per batch.

Patches of all images and videos of a batch are placed, on the host, into a padded
*window layout*: windows of `window_size` pixels (a square of merged 2x2 patch units) are
laid out one after another, each padded to the full window length. This is the reference's
window-index permutation with fixed-size windows, so window attention is a batched attention
over [num_windows, window_len] rows (padding slots are segment 0), and the blocks listed in
`fullatt_block_indexes` attend within each image frame: all slots form one row whose segment
ids are the frame ids, so no mask across all images is built (models/attention.py). After the
merger, `merged_index` gathers the merged tokens back into the processor's order (the
inverse permutation). The number of windows and of merged tokens are rounded up to a few
bucket sizes, so new image sizes within a bucket do not retrace.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from pyvision_jax.models.attention import AttentionConfig, attention
from pyvision_jax.models.config import VisionConfig
from pyvision_jax.models.layer_scan import scan_layers, stacked
from pyvision_jax.models.sharding import linear, param, shard_activation

# ---------------------------------------------------------------------- host-side layout


@struct.dataclass
class VisionLayout:
    """Index arrays (from grid_thw) that place patches into the padded window layout.

    patch_index [S]: row of pixel_values for each slot (any value where not slot_valid).
    slot_valid [S]: the slot holds a real patch.
    positions [S, 2]: (row, column) of the slot's patch within its frame, for the 2-D rope.
    frame_id [S]: image/video frame of the slot (-1 for padding); full attention stays within it.
    merged_index [M]: for each merged output token in processor order, its merged slot.
    """

    patch_index: jax.Array
    slot_valid: jax.Array
    positions: jax.Array
    frame_id: jax.Array
    merged_index: jax.Array

    @property
    def num_slots(self) -> int:
        return self.patch_index.shape[0]


def bucket_size(n: int, minimum: int = 1) -> int:
    """Smallest of 2^k and 3*2^(k-1) that is >= max(n, minimum): a few sizes, <= 50% padding."""
    n = max(int(n), int(minimum), 1)
    power = 1 << (n - 1).bit_length()
    three_quarters = 3 * power // 4
    return three_quarters if three_quarters >= n and three_quarters * 4 == 3 * power else power


def window_units(config: VisionConfig) -> int:
    """Merged units along one side of an attention window."""
    return config.window_size // config.spatial_merge_size // config.patch_size


def max_image_tokens(config: VisionConfig, max_pixels: int) -> int:
    """Merged tokens of an image of at most `max_pixels` pixels."""
    return int(max_pixels) // (config.patch_size * config.spatial_merge_size) ** 2


def image_room(config: VisionConfig, images: int, tokens_per_image: int) -> tuple[int, int]:
    """(windows, merged tokens), bucketed, of a layout holding `images` square images of
    `tokens_per_image` merged tokens each: a floor that layouts of such images stay within."""
    side = math.ceil(math.sqrt(max(int(tokens_per_image), 1)))
    windows = math.ceil(side / window_units(config)) ** 2
    return bucket_size(images * windows), bucket_size(images * tokens_per_image)


def vision_layout(
    grid_thw: np.ndarray, config: VisionConfig, min_windows: int = 1, min_merged: int = 1
) -> VisionLayout:
    """Window layout for images/videos with the given [n, 3] grids (concatenated in order)."""
    grid_thw = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    merge, unit = config.spatial_merge_size, config.merge_unit
    side = window_units(config)
    tables, frames, positions = [], [], []
    unit_offset, frame_offset = 0, 0
    for index, (t, h, w) in enumerate(grid_thw):
        if t < 1 or h % merge or w % merge or h < merge or w < merge:
            raise ValueError(
                f"grid_thw[{index}] = {[int(t), int(h), int(w)]}: t must be >= 1 and h, w "
                f"positive multiples of spatial_merge_size={merge}"
            )
        lh, lw = h // merge, w // merge
        nwh, nww = -(-lh // side), -(-lw // side)
        units = np.full((t, nwh * side, nww * side), -1, dtype=np.int64)
        units[:, :lh, :lw] = np.arange(t * lh * lw).reshape(t, lh, lw) + unit_offset
        windows = units.reshape(t, nwh, side, nww, side).transpose(0, 1, 3, 2, 4).reshape(-1, side * side)
        tables.append(windows)
        frames.append(np.repeat(np.arange(t) + frame_offset, nwh * nww))
        # (row, col) of each patch in processor order: merge blocks row-major, then inside a block.
        rows = np.arange(lh)[:, None, None, None] * merge + np.arange(merge)[None, None, :, None]
        cols = np.arange(lw)[None, :, None, None] * merge + np.arange(merge)[None, None, None, :]
        rows, cols = np.broadcast_arrays(rows, cols)
        frame_pos = np.stack([rows.reshape(-1), cols.reshape(-1)], axis=-1)
        positions.append(np.tile(frame_pos, (t, 1)))
        unit_offset += t * lh * lw
        frame_offset += t
    num_windows = sum(len(tb) for tb in tables)
    padded_windows = bucket_size(num_windows, min_windows)
    table = np.full((padded_windows, side * side), -1, dtype=np.int64)
    window_frame = np.full(padded_windows, -1, dtype=np.int64)
    if tables:
        table[:num_windows] = np.concatenate(tables)
        window_frame[:num_windows] = np.concatenate(frames)
    unit_slots = table.reshape(-1)
    valid_units = unit_slots >= 0
    slot_unit = np.repeat(unit_slots, unit)
    slot_valid = np.repeat(valid_units, unit)
    patch_index = np.where(slot_valid, slot_unit * unit + np.tile(np.arange(unit), len(unit_slots)), 0)
    all_positions = np.concatenate(positions) if positions else np.zeros((1, 2), np.int64)
    slot_positions = np.where(slot_valid[:, None], all_positions[patch_index], 0)
    frame_id = np.where(slot_valid, np.repeat(np.repeat(window_frame, side * side), unit), -1)
    merged_index = np.zeros(bucket_size(unit_offset, min_merged), dtype=np.int64)
    merged_index[unit_slots[valid_units]] = np.nonzero(valid_units)[0]
    return VisionLayout(
        patch_index=patch_index.astype(np.int32),
        slot_valid=slot_valid,
        positions=slot_positions.astype(np.int32),
        frame_id=frame_id.astype(np.int32),
        merged_index=merged_index.astype(np.int32),
    )


def num_merged_tokens(grid_thw: np.ndarray, spatial_merge_size: int) -> int:
    grid_thw = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    return int(np.sum(np.prod(grid_thw, axis=-1))) // spatial_merge_size**2


# ---------------------------------------------------------------------- numerics


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype: Any) -> jax.Array:
    """RMSNorm in float32; the normalized value is cast to `dtype` before the scale."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(dtype) * normed.astype(dtype)


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate in float32 (cos/sin broadcast over the head axis), return x's dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


def vision_rope(positions: jax.Array, head_dim: int, theta: float = 10000.0) -> tuple[jax.Array, jax.Array]:
    """2-D rope: the first half of the rotary frequencies follow the row, the second the column."""
    quarter = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, quarter, 2, dtype=jnp.float32) / quarter))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [S, 2, head_dim/4]
    freqs = freqs.reshape(positions.shape[0], -1)  # [S, head_dim/2]: rows then columns
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [S, 1, head_dim]
    return jnp.cos(emb), jnp.sin(emb)


# ---------------------------------------------------------------------- modules


class RMSNorm(nnx.Module):
    def __init__(
        self, dim: int, eps: float, *, rngs: nnx.Rngs, param_dtype: Any = jnp.float32, dtype: Any = jnp.float32
    ):
        self.scale = param(nnx.initializers.ones_init(), rngs, (dim,), param_dtype, ("norm",))
        self.eps, self.dtype = eps, dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps, self.dtype)


class VisionAttention(nnx.Module):
    def __init__(
        self,
        config: VisionConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: Any,
        dtype: Any,
        attention: AttentionConfig = AttentionConfig(),
    ):
        d = config.hidden_size
        self.attention = attention
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = linear(
            d, 3 * d, ("vit_embed", "vit_qkv"), use_bias=True, rngs=rngs, param_dtype=param_dtype, dtype=dtype
        )
        self.proj = linear(
            d, d, ("vit_heads", "vit_embed"), use_bias=True, rngs=rngs, param_dtype=param_dtype, dtype=dtype
        )

    def __call__(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, layout: VisionLayout, window_len: int, full: bool
    ) -> jax.Array:
        slots = x.shape[0]
        q, k, v = jnp.split(self.qkv(x).reshape(slots, 3 * self.num_heads, self.head_dim), 3, axis=1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if full:  # all slots as one row, each image/video frame a segment (padding: 0)
            segments = (layout.frame_id + 1)[None]
        else:  # one row per window, its padding slots segment 0
            segments = layout.slot_valid.reshape(-1, window_len).astype(jnp.int32)
        rows = segments.shape + (self.num_heads, self.head_dim)
        out = attention(
            q.reshape(rows),
            k.reshape(rows),
            v.reshape(rows),
            segments,
            segments,
            causal=False,
            scale=self.head_dim**-0.5,
            config=self.attention,
        )
        return self.proj(out.reshape(slots, -1))


class VisionMLP(nnx.Module):
    def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        d, f = config.hidden_size, config.intermediate_size
        kw = dict(use_bias=True, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.gate_proj = linear(d, f, ("vit_embed", "vit_mlp"), **kw)
        self.up_proj = linear(d, f, ("vit_embed", "vit_mlp"), **kw)
        self.down_proj = linear(f, d, ("vit_mlp", "vit_embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nnx.Module):
    def __init__(
        self,
        config: VisionConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: Any,
        dtype: Any,
        attention: AttentionConfig = AttentionConfig(),
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.norm1 = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.norm2 = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.attn = VisionAttention(config, attention=attention, **kw)
        self.mlp = VisionMLP(config, **kw)

    def __call__(self, x, cos, sin, layout: VisionLayout, window_len: int, full: bool) -> jax.Array:
        x = x + self.attn(self.norm1(x), cos, sin, layout, window_len, full)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nnx.Module):
    """The Conv3d with stride == kernel, as a matmul on flattened (C, T, P, P) patches."""

    def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        self.proj = linear(
            config.patch_dim,
            config.hidden_size,
            ("vit_patch", "vit_embed"),
            use_bias=False,
            rngs=rngs,
            param_dtype=param_dtype,
            dtype=dtype,
        )

    def __call__(self, patches: jax.Array) -> jax.Array:
        return self.proj(patches)


class PatchMerger(nnx.Module):
    """RMSNorm, then spatial_merge_size^2 neighbouring patches -> MLP (GELU) -> out_hidden_size."""

    def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, param_dtype: Any, dtype: Any):
        merged = config.hidden_size * config.merge_unit
        kw = dict(use_bias=True, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.ln_q = RMSNorm(config.hidden_size, config.rms_norm_eps, rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.mlp = nnx.List(
            [
                linear(merged, merged, ("vit_merge", "vit_mlp"), **kw),
                None,
                linear(merged, config.out_hidden_size, ("vit_mlp", "embed"), **kw),
            ]
        )
        self.merged = merged

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.ln_q(x).reshape(-1, self.merged)
        return self.mlp[2](jax.nn.gelu(self.mlp[0](h), approximate=False))


class VisionTransformer(nnx.Module):
    def __init__(
        self,
        config: VisionConfig,
        *,
        rngs: nnx.Rngs,
        param_dtype: Any = jnp.float32,
        dtype: Any = jnp.float32,
        attention: AttentionConfig = AttentionConfig(),
    ):
        kw = dict(rngs=rngs, param_dtype=param_dtype, dtype=dtype)
        self.config = config
        self.dtype = dtype
        self.patch_embed = PatchEmbed(config, **kw)
        self.blocks = stacked(
            config.depth,
            lambda block_rngs: VisionBlock(
                config, rngs=block_rngs, param_dtype=param_dtype, dtype=dtype, attention=attention
            ),
            rngs,
        )
        self.merger = PatchMerger(config, **kw)

    def __call__(self, pixel_values: jax.Array, layout: VisionLayout, remat: str = "none") -> jax.Array:
        """pixel_values [N, C*T*P*P] (N >= real patches) -> merged features [M, out_hidden_size].

        The blocks run as one scan; each step takes the window-attention or the
        full-attention branch (`lax.cond` on the block's entry in `fullatt_block_indexes`),
        so both kinds compile once whatever the depth. Slots are sharded over the batch
        mesh axes by whole windows."""
        cfg = self.config
        window_len = window_units(cfg) ** 2 * cfg.merge_unit
        patches = jnp.take(pixel_values, layout.patch_index, axis=0, mode="clip")
        patches = jnp.where(layout.slot_valid[:, None], patches, 0).astype(self.dtype)
        x = self.patch_embed(patches)
        cos, sin = vision_rope(layout.positions, cfg.head_dim)
        is_full = np.isin(np.arange(cfg.depth), cfg.fullatt_block_indexes)

        def block_step(block: VisionBlock, x: jax.Array, full: jax.Array) -> tuple[jax.Array, None]:
            windows = x.reshape(-1, window_len, x.shape[-1])
            x = shard_activation(windows, ("vit_windows", None, None)).reshape(x.shape)
            run = lambda full_attention: lambda h: block(h, cos, sin, layout, window_len, full_attention)
            return jax.lax.cond(full, run(True), run(False), x), None

        x, _ = scan_layers(self.blocks, block_step, x, jnp.asarray(is_full), remat=remat)
        merged = self.merger(x)
        return jnp.take(merged, layout.merged_index, axis=0)
