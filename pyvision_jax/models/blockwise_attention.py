"""Blockwise attention in pure JAX: an online softmax over key/value blocks for each block of
queries, with a hand-written backward pass that recomputes the scores block by block.

Only the output and the per-query logsumexp are kept for the backward pass, so memory grows
as O(T x block), never O(T x S). Which blocks can hold a visible key is decided once per call
(`live_blocks`): blocks above the causal diagonal and blocks whose segment-id ranges do not
overlap (different packed trajectories, different images) are skipped by a `lax.cond`.
Arrays are heads-major: q [B, KVH, G, T, d] (the G query heads sharing each kv head),
k/v [B, KVH, S, d], segment ids [B, T] / [B, S] (0 marks padding, which sees nothing and
returns zeros).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
"""Score of a hidden key: finite, so a query with no visible key never produces NaN."""

_NO_SEGMENT = np.iinfo(np.int32).max


def block_count(length: int, block: int) -> tuple[int, int]:
    """(block size, number of blocks) for `length` tokens: one block when it fits, else blocks
    of `block` with the last one padded."""
    size = min(block, length)
    return size, -(-length // size)


def _segment_ranges(segments: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Smallest and largest non-padding segment id of each block: [B, n] each (an all-padding
    block gets an empty range, lowest > highest)."""
    blocks = segments.reshape(segments.shape[0], -1, block)
    lowest = jnp.min(jnp.where(blocks > 0, blocks, _NO_SEGMENT), axis=-1)
    return lowest, jnp.max(blocks, axis=-1)


def live_blocks(q_segments: jax.Array, kv_segments: jax.Array, causal: bool, block_q: int, block_kv: int) -> jax.Array:
    """[num_q_blocks, num_kv_blocks] bool: the block may hold a visible (query, key) pair in
    some row. Exact for contiguous segments, conservative otherwise (the mask stays exact)."""
    q_low, q_high = _segment_ranges(q_segments, block_q)
    k_low, k_high = _segment_ranges(kv_segments, block_kv)
    overlap = (q_low[:, :, None] <= k_high[:, None, :]) & (k_low[:, None, :] <= q_high[:, :, None])
    live = jnp.any(overlap, axis=0)
    if causal:
        q_last = (np.arange(live.shape[0]) + 1) * block_q - 1
        k_first = np.arange(live.shape[1]) * block_kv
        live = live & jnp.asarray(k_first[None, :] <= q_last[:, None])
    return live


def _block_mask(
    q_segments: jax.Array, kv_segments: jax.Array, q_start: jax.Array, kv_start: jax.Array, causal: bool
) -> jax.Array:
    """[B, 1, 1, bq, bk]: same non-padding segment and, if causal, key position <= query's."""
    visible = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] != 0)
    if causal:
        rows = q_start + jnp.arange(q_segments.shape[1])
        cols = kv_start + jnp.arange(kv_segments.shape[1])
        visible = visible & (cols[None, :] <= rows[:, None])[None]
    return visible[:, None, None]


def _slice(x: jax.Array, start: jax.Array, size: int, axis: int) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _scores(q_block: jax.Array, k_block: jax.Array, scale: float) -> jax.Array:
    return jnp.einsum("bkgqd,bksd->bkgqs", q_block, k_block, preferred_element_type=jnp.float32) * scale


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _blockwise(q, k, v, q_segments, kv_segments, causal, scale, block_q, block_kv):
    return _forward(q, k, v, q_segments, kv_segments, causal, scale, block_q, block_kv)[0]


def _forward(q, k, v, q_segments, kv_segments, causal, scale, block_q, block_kv):
    b, kvh, g, t, d = q.shape
    num_q, num_kv = t // block_q, k.shape[2] // block_kv
    live = live_blocks(q_segments, kv_segments, causal, block_q, block_kv)

    def query_block(i):
        q_start = i * block_q
        q_i, qs_i = _slice(q, q_start, block_q, 3), _slice(q_segments, q_start, block_q, 1)

        def accumulate(carry, j):
            peak, total, acc = carry
            kv_start = j * block_kv
            mask = _block_mask(qs_i, _slice(kv_segments, kv_start, block_kv, 1), q_start, kv_start, causal)
            scores = jnp.where(mask, _scores(q_i, _slice(k, kv_start, block_kv, 2), scale), MASK_VALUE)
            new_peak = jnp.maximum(peak, jnp.max(scores, axis=-1))
            probs = jnp.where(mask, jnp.exp(scores - new_peak[..., None]), 0.0)
            decay = jnp.exp(peak - new_peak)
            acc = acc * decay[..., None] + jnp.einsum(
                "bkgqs,bksd->bkgqd",
                probs.astype(v.dtype),
                _slice(v, kv_start, block_kv, 2),
                preferred_element_type=jnp.float32,
            )
            return new_peak, total * decay + jnp.sum(probs, axis=-1), acc

        def step(carry, j):
            return jax.lax.cond(live[i, j], accumulate, lambda c, _: c, carry, j), None

        init = (
            jnp.full((b, kvh, g, block_q), MASK_VALUE, jnp.float32),
            jnp.zeros((b, kvh, g, block_q), jnp.float32),
            jnp.zeros((b, kvh, g, block_q, d), jnp.float32),
        )
        (peak, total, acc), _ = jax.lax.scan(step, init, jnp.arange(num_kv))
        seen = total > 0
        safe_total = jnp.where(seen, total, 1.0)
        out = jnp.where(seen[..., None], acc / safe_total[..., None], 0.0)
        return out.astype(q.dtype), jnp.where(seen, peak + jnp.log(safe_total), 0.0)

    outs, logsumexp = jax.lax.map(query_block, jnp.arange(num_q))
    out = jnp.moveaxis(outs, 0, 3).reshape(q.shape)
    logsumexp = jnp.moveaxis(logsumexp, 0, 3).reshape(q.shape[:-1])
    return out, (q, k, v, q_segments, kv_segments, out, logsumexp)


def _backward(causal, scale, block_q, block_kv, residuals, d_out):
    """One pass over key blocks (outer) and query blocks (inner): dk/dv of the key block are
    the inner loop's carry, dq is accumulated in place. dS = P * (dP - rowsum(dO * O))."""
    q, k, v, q_segments, kv_segments, out, logsumexp = residuals
    b, kvh, g, t, d = q.shape
    num_q, num_kv = t // block_q, k.shape[2] // block_kv
    live = live_blocks(q_segments, kv_segments, causal, block_q, block_kv)
    d_out = d_out.astype(q.dtype)
    row_dot = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

    def key_block(d_q, j):
        kv_start = j * block_kv
        k_j, v_j = _slice(k, kv_start, block_kv, 2), _slice(v, kv_start, block_kv, 2)
        ks_j = _slice(kv_segments, kv_start, block_kv, 1)

        def accumulate(carry, i):
            d_q, d_k, d_v = carry
            q_start = i * block_q
            q_i, do_i = _slice(q, q_start, block_q, 3), _slice(d_out, q_start, block_q, 3)
            mask = _block_mask(_slice(q_segments, q_start, block_q, 1), ks_j, q_start, kv_start, causal)
            lse_i = _slice(logsumexp, q_start, block_q, 3)
            probs = jnp.where(mask, jnp.exp(_scores(q_i, k_j, scale) - lse_i[..., None]), 0.0)
            d_v = d_v + jnp.einsum("bkgqs,bkgqd->bksd", probs.astype(q.dtype), do_i, preferred_element_type=jnp.float32)
            d_probs = jnp.einsum("bkgqd,bksd->bkgqs", do_i, v_j, preferred_element_type=jnp.float32)
            d_scores = (probs * (d_probs - _slice(row_dot, q_start, block_q, 3)[..., None]) * scale).astype(q.dtype)
            d_q_i = jnp.einsum("bkgqs,bksd->bkgqd", d_scores, k_j, preferred_element_type=jnp.float32)
            d_q = jax.lax.dynamic_update_slice_in_dim(d_q, _slice(d_q, q_start, block_q, 3) + d_q_i, q_start, 3)
            d_k = d_k + jnp.einsum("bkgqs,bkgqd->bksd", d_scores, q_i, preferred_element_type=jnp.float32)
            return d_q, d_k, d_v

        def step(carry, i):
            return jax.lax.cond(live[i, j], accumulate, lambda c, _: c, carry, i), None

        zeros = jnp.zeros((b, kvh, block_kv, d), jnp.float32)
        (d_q, d_k, d_v), _ = jax.lax.scan(step, (d_q, zeros, zeros), jnp.arange(num_q))
        return d_q, (d_k, d_v)

    d_q, (d_k, d_v) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(num_kv))
    to_keys = lambda blocks, like: jnp.moveaxis(blocks, 0, 2).reshape(like.shape).astype(like.dtype)
    return d_q.astype(q.dtype), to_keys(d_k, k), to_keys(d_v, v), None, None


_blockwise.defvjp(_forward, _backward, optimize_remat=True)


def _pad_axis(x: jax.Array, length: int, axis: int) -> jax.Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad)


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segments: jax.Array,
    kv_segments: jax.Array,
    *,
    causal: bool,
    scale: float,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Heads-major q [B, KVH, G, T, d], k/v [B, KVH, S, d] -> [B, KVH, G, T, d] in q's dtype.

    Lengths that blocks do not divide are padded with segment id 0 (hidden keys)."""
    t, s = q.shape[3], k.shape[2]
    bq, num_q = block_count(t, block_q)
    bk, num_kv = block_count(s, block_kv)
    padded_q, padded_kv = bq * num_q, bk * num_kv
    out = _blockwise(
        _pad_axis(q, padded_q, 3),
        _pad_axis(k, padded_kv, 2),
        _pad_axis(v, padded_kv, 2),
        _pad_axis(q_segments.astype(jnp.int32), padded_q, 1),
        _pad_axis(kv_segments.astype(jnp.int32), padded_kv, 1),
        causal,
        float(scale),
        bq,
        bk,
    )
    return out[:, :, :, :t]
