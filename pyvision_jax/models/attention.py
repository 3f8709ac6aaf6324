"""Attention over packed sequences, the implementation chosen by name (`model.attention`).

Every implementation takes token-major q [B, T, H, d], k/v [B, S, KVH, d] (grouped-query:
H a multiple of KVH) and segment ids [B, T] / [B, S]: a query sees only keys of its own
segment, segment id 0 is padding (it sees nothing and its output is zero), and with
`causal` a query at position t sees keys at positions <= t. The softmax is fp32; the output
has q's dtype.

- "dense": the reference; materialises the [T, S] scores.
- "blockwise": online softmax over blocks with a recomputing backward pass
  (models/blockwise_attention.py); O(T x block) memory; the default, and the one for CPU.
- "cudnn": cuDNN flash attention, GPU only (Hopper or newer for packed rows). Segments go in
  as cuDNN's packed layout (each row's segment offsets and lengths, `packed_segments`), so
  no [T, S] mask or bias exists; rows the layout cannot express (more than
  CUDNN_MAX_SEGMENTS segments, or a segment id in two separate runs) take the blockwise
  kernel instead, chosen at run time. A jax without the packed layout gets the public
  `jax.nn.dot_product_attention` with a [B, 1, T, S] mask.
- "splash": the Pallas TPU splash-attention kernel, one call per row; under a mesh set with
  `jax.set_mesh` it runs in a `shard_map` over the batch axes (a Pallas call is not
  partitioned by the compiler). On CPU it runs in Pallas interpret mode (for tests: slow).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

try:  # cuDNN's packed layout (segment offsets) is not in jax.nn.dot_product_attention's signature
    from jax._src.cudnn import fused_attention_stablehlo as _cudnn_fused
except ImportError:
    _cudnn_fused = None

from pyvision_jax.models.blockwise_attention import MASK_VALUE, block_count, blockwise_attention
from pyvision_jax.models.sharding import mesh_partition_spec

IMPLEMENTATIONS = ("dense", "blockwise", "cudnn", "splash")

SPLASH_LANES = 128
"""Splash block sizes must be multiples of the TPU lane width."""

CUDNN_MAX_SEGMENTS = 16
"""Segments per row the packed cuDNN call is compiled for: its softmax statistics are
[B * this, H, T] float32 (at T = 32768 and 28 heads, 59 MiB per row)."""


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Training/prefill and vision-tower attention: `implementation` (one of IMPLEMENTATIONS)
    and the query/key block sizes of the blockwise and splash kernels."""

    implementation: str = "blockwise"
    block_q: int = 128
    block_kv: int = 128

    def __post_init__(self) -> None:
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"model.attention={self.implementation!r} is not an attention implementation; "
                f"choose one of {list(IMPLEMENTATIONS)}"
            )
        for name in ("block_q", "block_kv"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.attention_{name} must be a positive integer, got {value!r}")


def query_groups(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, H, d] -> heads-major [B, KVH, G, T, d], the G query heads sharing each kv head."""
    b, t, h, d = q.shape
    return q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)


def _token_major(out: jax.Array) -> jax.Array:
    """[B, KVH, G, T, d] -> [B, T, H, d]."""
    b, kvh, g, t, d = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g, d)


def _visible(q_segments: jax.Array, kv_segments: jax.Array, causal: bool) -> jax.Array:
    """[B, T, S] boolean: same segment, query not padding, and key not after the query."""
    same = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] != 0)
    if causal:
        t, s = q_segments.shape[1], kv_segments.shape[1]
        same = same & jnp.tril(jnp.ones((t, s), bool))[None]
    return same


def dense_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segments: jax.Array,
    kv_segments: jax.Array,
    *,
    causal: bool,
    scale: float,
) -> jax.Array:
    """The reference, heads-major q [B, KVH, G, T, d], k/v [B, KVH, S, d] -> [B, KVH, G, T, d]."""
    mask = _visible(q_segments, kv_segments, causal)[:, None, None]
    scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    probs = jnp.where(mask, jax.nn.softmax(jnp.where(mask, scores, MASK_VALUE), axis=-1), 0.0)
    return jnp.einsum("bkgts,bksd->bkgtd", probs.astype(v.dtype), v).astype(q.dtype)


def _zero_padding_queries(out: jax.Array, q_segments: jax.Array, dtype: Any) -> jax.Array:
    """Token-major [B, T, H, d] with the rows of padding queries zeroed."""
    return jnp.where((q_segments != 0)[:, :, None, None], out, 0).astype(dtype)


def cudnn_packed_layout_available() -> bool:
    """Whether this jax's cuDNN attention takes packed rows (per-segment offsets and lengths)."""
    if _cudnn_fused is None:
        return False
    parameters = inspect.signature(_cudnn_fused.dot_product_attention).parameters
    return (
        {"q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "mask_type"} <= set(parameters)
        and hasattr(_cudnn_fused, "MaskType")
        and hasattr(_cudnn_fused.MaskType, "PADDING_CAUSAL")
    )


def packed_segments(segments: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Segment ids [B, T] as cuDNN's packed layout: (lengths [B, M], offsets [B, M + 1], run ids
    [B, M], fits []). A run is a maximal stretch of one non-zero id; row b's runs in order have
    their lengths, start positions and ids in the first entries, -1 (ids: 0) after. `fits`
    says that the layout means what the ids mean: every row has at most M runs, each id
    forms one run (ids increase along the row), and some row has a run."""
    b, t = segments.shape
    previous = jnp.pad(segments[:, :-1], ((0, 0), (1, 0)))
    starts = (segments != 0) & (segments != previous)
    seen = jax.lax.cummax(previous, axis=1)  # largest id before each position
    counts = jnp.sum(starts, axis=1)
    fits = jnp.all(~starts | (segments > seen)) & jnp.all(counts <= max_segments) & jnp.any(counts > 0)
    run = jnp.cumsum(starts, axis=1) - 1
    rows = jnp.arange(b)[:, None]
    slot = lambda keep, size: jnp.where(keep & (run < max_segments), run, size)  # noqa: E731
    lengths = jnp.zeros((b, max_segments), jnp.int32).at[rows, slot(segments != 0, max_segments)].add(1, mode="drop")
    used = jnp.arange(max_segments)[None] < counts[:, None]
    offsets = (
        jnp.full((b, max_segments + 1), -1, jnp.int32)
        .at[rows, slot(starts, max_segments + 1)]
        .set(jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), mode="drop")
    )
    ids = jnp.zeros((b, max_segments), segments.dtype).at[rows, slot(starts, max_segments)].set(segments, mode="drop")
    return jnp.where(used, lengths, -1), offsets, ids, fits


@functools.cache
def cudnn_packed_gqa_safe() -> bool:
    """Whether this jax scales packed kv offsets by the key's own per-token stride; releases
    up to 0.10 use the query's, which is wrong when there are fewer kv heads than query heads.
    Found by running jax's offset conversion on a small example."""
    query, key = np.zeros((1, 4, 4, 8), np.float32), np.zeros((1, 4, 1, 8), np.float32)
    lengths, offsets = np.array([[2, 2]], np.int32), np.array([[0, 2, -1]], np.int32)
    try:
        with jax.ensure_compile_time_eval():
            converted = _cudnn_fused._fix_seqlen_offsets(lengths, lengths, offsets, offsets, query, key)[3]
        return int(np.asarray(converted).reshape(-1)[1]) == 2 * key.shape[2] * key.shape[3]
    except Exception:  # noqa: BLE001 (an unknown jax: repeat the kv heads, which is always right)
        return False


def _cudnn_packed(
    q: jax.Array, k: jax.Array, v: jax.Array, q_layout: tuple, kv_layout: tuple, *, causal: bool, scale: float
) -> jax.Array:
    """cuDNN flash attention over packed rows; the kv heads are repeated up to the query heads
    where jax's packed layout gets grouped-query offsets wrong (`cudnn_packed_gqa_safe`)."""
    groups = q.shape[2] // k.shape[2]
    if groups > 1 and not cudnn_packed_gqa_safe():
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    mask_type = _cudnn_fused.MaskType.PADDING_CAUSAL if causal else _cudnn_fused.MaskType.PADDING
    return _cudnn_fused.dot_product_attention(
        q,
        k,
        v,
        q_seqlen=q_layout[0],
        kv_seqlen=kv_layout[0],
        q_offsets=q_layout[1],
        kv_offsets=kv_layout[1],
        scale=scale,
        mask_type=mask_type,
        qkv_layout="BTNH",
    )


def cudnn_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segments: jax.Array,
    kv_segments: jax.Array,
    *,
    causal: bool,
    scale: float,
    block_q: int = 128,
    block_kv: int = 128,
) -> jax.Array:
    """Token-major cuDNN flash attention (GPU) on cuDNN's packed layout; rows it cannot express
    run the blockwise kernel (`block_q`, `block_kv`). Inputs of padding tokens are zeroed,
    so whatever the kernel leaves at positions outside every segment reaches neither the
    output nor the gradients."""
    backend = jax.default_backend()
    if backend != "gpu":
        raise ValueError(
            f"model.attention='cudnn' needs a GPU, but the JAX backend is {backend!r}; "
            "set --config.model.attention=blockwise (or splash on TPU)"
        )
    if not cudnn_packed_layout_available():
        mask = (q_segments[:, :, None] == kv_segments[:, None, :])[:, None]
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal, implementation="cudnn")
        return _zero_padding_queries(out, q_segments, q.dtype)
    q_layout = packed_segments(q_segments.astype(jnp.int32), CUDNN_MAX_SEGMENTS)
    kv_layout = packed_segments(kv_segments.astype(jnp.int32), CUDNN_MAX_SEGMENTS)
    fits = q_layout[3] & kv_layout[3] & jnp.all(q_layout[2] == kv_layout[2])
    live = lambda x, segments: jnp.where((segments != 0)[:, :, None, None], x, 0).astype(x.dtype)  # noqa: E731
    q, k, v = live(q, q_segments), live(k, kv_segments), live(v, kv_segments)

    def packed(q, k, v):
        return _cudnn_packed(q, k, v, q_layout[:2], kv_layout[:2], causal=causal, scale=scale)

    def blockwise(q, k, v):
        out = blockwise_attention(
            query_groups(q, k.shape[2]),
            k.transpose(0, 2, 1, 3),
            v.transpose(0, 2, 1, 3),
            q_segments,
            kv_segments,
            causal=causal,
            scale=scale,
            block_q=block_q,
            block_kv=block_kv,
        )
        return _token_major(out)

    out = jax.lax.cond(fits, packed, blockwise, q, k, v)
    return _zero_padding_queries(out, q_segments, q.dtype)


def _splash_blocks(length: int, block: int, field: str) -> tuple[int, int]:
    """(block, padded length) for splash: both multiples of SPLASH_LANES."""
    if block % SPLASH_LANES:
        raise ValueError(f"model.attention='splash' needs {field} to be a multiple of {SPLASH_LANES}, got {block}")
    lanes = -(-length // SPLASH_LANES) * SPLASH_LANES
    size, count = block_count(lanes, block)
    return size, size * count


def splash_attention(
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
    """Token-major Pallas splash attention, one kernel call per row (vmapped over the batch).
    On CPU the kernel runs in Pallas interpret mode; GPUs have "cudnn" instead."""
    backend = jax.default_backend()
    if backend == "gpu":
        raise ValueError("model.attention='splash' is a TPU kernel; on GPU set --config.model.attention=cudnn")
    b, t, h, d = q.shape
    s = k.shape[1]
    bq, padded_q = _splash_blocks(t, block_q, "model.attention_block_q")
    bk, padded_kv = _splash_blocks(s, block_kv, "model.attention_block_kv")
    pad = lambda x, length: jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
    heads_first = lambda x, length: pad(x, length).transpose(0, 2, 1, 3)
    shape = (padded_q, padded_kv)
    base = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    sizes = splash.BlockSizes(
        block_q=bq,
        block_kv=bk,
        block_kv_compute=bk,
        block_q_dkv=bq,
        block_kv_dkv=bk,
        block_kv_dkv_compute=bk,
        block_q_dq=bq,
        block_kv_dq=bk,
    )
    kernel = splash.make_splash_mha(
        splash.MultiHeadMask([base] * h), block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=backend != "tpu"
    )
    run_rows = lambda q, k, v, q_ids, kv_ids: jax.vmap(kernel)(q, k, v, splash.SegmentIds(q_ids, kv_ids))
    out = _on_batch_shards(
        run_rows,
        heads_first(q * jnp.asarray(scale, q.dtype), padded_q),
        heads_first(k, padded_kv),
        heads_first(v, padded_kv),
        pad(q_segments.astype(jnp.int32), padded_q),
        pad(kv_segments.astype(jnp.int32), padded_kv),
    )
    return _zero_padding_queries(out.transpose(0, 2, 1, 3)[:, :t], q_segments, q.dtype)


def _on_batch_shards(run_rows: Any, *arrays: jax.Array) -> jax.Array:
    """`run_rows(*arrays)` (all batch-major) on each device's rows of the current mesh's
    batch axes; directly when no mesh is set."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return run_rows(*arrays)
    batch = mesh_partition_spec(("batch",), arrays[0].shape[:1], mesh)[0]
    rows = [PartitionSpec(batch, *([None] * (x.ndim - 1))) for x in arrays]
    return jax.shard_map(run_rows, in_specs=tuple(rows), out_specs=rows[0], check_vma=False)(*arrays)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segments: jax.Array,
    kv_segments: jax.Array,
    *,
    causal: bool,
    scale: float,
    config: AttentionConfig = AttentionConfig(),
) -> jax.Array:
    """q [B, T, H, d], k/v [B, S, KVH, d], segment ids [B, T] / [B, S] -> [B, T, H, d]."""
    b, t, h, d = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or h % kv_heads:
        raise ValueError(
            f"attention: q {q.shape}, k {k.shape}, v {v.shape} are not [B, T, H, d], "
            "[B, S, KVH, d] with H a multiple of KVH"
        )
    if q_segments.shape != (b, t) or kv_segments.shape != (b, s):
        raise ValueError(f"attention: segment ids {q_segments.shape} / {kv_segments.shape} must be {(b, t)} / {(b, s)}")
    if causal and t != s:
        raise ValueError(f"attention: causal self-attention needs as many queries as keys, got {t} and {s}")
    impl = config.implementation
    if impl == "cudnn":
        return cudnn_attention(
            q,
            k,
            v,
            q_segments,
            kv_segments,
            causal=causal,
            scale=scale,
            block_q=config.block_q,
            block_kv=config.block_kv,
        )
    if impl == "splash":
        return splash_attention(
            q,
            k,
            v,
            q_segments,
            kv_segments,
            causal=causal,
            scale=scale,
            block_q=config.block_q,
            block_kv=config.block_kv,
        )
    qg, kh, vh = query_groups(q, kv_heads), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if impl == "dense":
        out = dense_attention(qg, kh, vh, q_segments, kv_segments, causal=causal, scale=scale)
    else:
        out = blockwise_attention(
            qg,
            kh,
            vh,
            q_segments,
            kv_segments,
            causal=causal,
            scale=scale,
            block_q=config.block_q,
            block_kv=config.block_kv,
        )
    return _token_major(out)
