"""Attention implementations against the dense reference: forward and gradients on packed,
ragged, causal and non-causal inputs with GQA; padding rows; compiled memory of blockwise."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import pyvision_jax.models.attention as attention_module
from pyvision_jax import wiring
from pyvision_jax.models import init_params, logits
from pyvision_jax.models.attention import AttentionConfig, attention
from pyvision_jax.models.blockwise_attention import live_blocks
from tests.models.model_configs import TINY
from tests.models.model_inputs import image_tokens, patches, right_padded, text

REPO = Path(__file__).resolve().parents[2]
SCALE = 0.3
PACKED = np.stack(
    [
        np.repeat([1, 2, 3, 0], [20, 30, 15, 10]),  # three trajectories, right padding
        np.repeat([0, 4, 0], [5, 60, 10]),  # left and right padding
        np.zeros(75, int),
    ]
)  # all padding


def qkv(t, s, heads=4, kv_heads=2, d=16, batch=3, seed=0, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    make = lambda length, h: jnp.asarray(r.normal(size=(batch, length, h, d)), dtype)
    return make(t, heads), make(s, kv_heads), make(s, kv_heads), make(t, heads)


@functools.partial(jax.jit, static_argnums=(0, 7))
def output_and_grads(config, q, k, v, weights, q_segments, kv_segments, causal):
    run = lambda q, k, v: attention(q, k, v, q_segments, kv_segments, causal=causal, scale=SCALE, config=config)
    loss = lambda q, k, v: jnp.sum(run(q, k, v).astype(jnp.float32) * weights.astype(jnp.float32))
    return run(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def assert_matches_dense(config, q, k, v, weights, q_segments, kv_segments, causal, tol=1e-5):
    dense = output_and_grads(AttentionConfig("dense"), q, k, v, weights, q_segments, kv_segments, causal)
    got = output_and_grads(config, q, k, v, weights, q_segments, kv_segments, causal)
    assert np.abs(np.asarray(dense[0])).max() > 0.5  # not a comparison of near-zero outputs
    for name, expected, actual in zip(("out", "dq", "dk", "dv"), (dense[0], *dense[1]), (got[0], *got[1])):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
        np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=tol, rtol=tol, err_msg=name)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("blocks", [(16, 24), (32, 8), (512, 512)])
def test_blockwise_matches_dense_on_packed_ragged_gqa(causal, blocks):
    q, k, v, weights = qkv(75, 75)
    segments = jnp.asarray(PACKED)
    assert_matches_dense(AttentionConfig("blockwise", *blocks), q, k, v, weights, segments, segments, causal)


def test_blockwise_matches_dense_for_cross_attention_and_one_kv_head():
    q, k, v, weights = qkv(40, 57, heads=3, kv_heads=1, seed=1, batch=2)
    q_segments = jnp.asarray(np.stack([np.repeat([1, 2], [25, 15]), np.repeat([3, 0], [30, 10])]))
    kv_segments = jnp.asarray(np.stack([np.repeat([2, 1, 0], [20, 30, 7]), np.repeat([0, 3], [7, 50])]))
    assert_matches_dense(AttentionConfig("blockwise", 16, 16), q, k, v, weights, q_segments, kv_segments, causal=False)


@pytest.mark.parametrize("causal", [True, False])
def test_splash_in_interpret_mode_matches_dense(causal):
    t = 200  # padded to 256: two blocks of 128 per axis
    q, k, v, weights = qkv(t, t, batch=2, seed=2)
    segments = jnp.asarray(np.stack([np.repeat([1, 2, 3, 0], [90, 50, 40, 20]), np.repeat([0, 7], [30, 170])]))
    assert_matches_dense(AttentionConfig("splash", 128, 128), q, k, v, weights, segments, segments, causal)


def test_splash_under_a_four_device_mesh_runs_per_shard_and_matches_dense():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run(
        [sys.executable, "-m", "tests.models.splash_mesh_check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "OK splash sharded" in result.stdout


@pytest.mark.parametrize("implementation", ["dense", "blockwise", "splash"])
def test_padding_rows_are_zero_and_their_gradients_finite(implementation):
    q, k, v, weights = qkv(75, 75)
    segments = jnp.asarray(PACKED)
    out, grads = output_and_grads(
        AttentionConfig(implementation, 128, 128), q, k, v, weights, segments, segments, causal=True
    )
    padding = PACKED == 0
    assert np.all(np.asarray(out)[padding] == 0)
    assert np.all(np.abs(np.asarray(out)[~padding]).max(axis=-1) > 0)
    for grad in grads:
        assert np.all(np.isfinite(np.asarray(grad)))
    assert np.all(np.asarray(grads[0])[padding] == 0)  # a padding query influences nothing


def test_bfloat16_blockwise_is_close_to_the_float32_reference():
    q, k, v, weights = qkv(75, 75, dtype=jnp.bfloat16)
    segments = jnp.asarray(PACKED)
    out, grads = output_and_grads(AttentionConfig("blockwise", 16, 24), q, k, v, weights, segments, segments, True)
    as32 = lambda x: x.astype(jnp.float32)
    ref_out, ref_grads = output_and_grads(
        AttentionConfig("dense"), as32(q), as32(k), as32(v), weights, segments, segments, True
    )
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    for actual, expected in zip((out, *grads), (ref_out, *ref_grads)):
        actual, expected = np.asarray(as32(actual)), np.asarray(expected)
        assert np.all(np.isfinite(actual))
        np.testing.assert_allclose(actual, expected, atol=0.05 * np.abs(expected).max(), rtol=0)


def test_live_blocks_skip_the_causal_upper_triangle_and_other_segments():
    segments = jnp.asarray(np.repeat([1, 2, 0], [32, 24, 8])[None])  # blocks of 16: 1 1 2 2(+pad) 0
    causal = np.asarray(live_blocks(segments, segments, True, 16, 16))
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)
    np.testing.assert_array_equal(causal, expected)
    full = np.asarray(live_blocks(segments, segments, False, 16, 16))
    np.testing.assert_array_equal(full, expected | expected.T)


def compiled_temp_bytes(implementation, t):
    config = AttentionConfig(implementation, 256, 256)
    loss = lambda q, k, v, s: jnp.sum(attention(q, k, v, s, s, causal=True, scale=SCALE, config=config))
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    compiled = (
        jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        .lower(spec(1, t, 4, 32), spec(1, t, 2, 32), spec(1, t, 2, 32), jax.ShapeDtypeStruct((1, t), jnp.int32))
        .compile()
    )
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("implementation, linear", [("blockwise", True), ("dense", False)])
def test_compiled_memory_of_forward_and_backward_grows_linearly_in_length(implementation, linear):
    small, medium, large = (compiled_temp_bytes(implementation, t) for t in (1024, 2048, 4096))
    growth = (large - medium) / (medium - small)  # 2 when linear in T, 4 when quadratic
    assert (growth < 2.5) == linear, (small, medium, large)


def test_cudnn_needs_a_gpu_and_says_which_key_to_change():
    q, k, v, weights = qkv(64, 64, batch=2, dtype=jnp.bfloat16)
    segments = jnp.asarray(np.stack([np.repeat([1, 2, 0], [20, 30, 14]), np.repeat([5, 0], [60, 4])]))
    if jax.default_backend() == "gpu":
        out = attention(q, k, v, segments, segments, causal=True, scale=SCALE, config=AttentionConfig("cudnn"))
        ref = attention(q, k, v, segments, segments, causal=True, scale=SCALE, config=AttentionConfig("dense"))
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)
    else:
        with pytest.raises(ValueError, match="needs a GPU.*--config.model.attention=blockwise"):
            attention(q, k, v, segments, segments, causal=True, scale=SCALE, config=AttentionConfig("cudnn"))


def test_bad_inputs_and_configs_are_named():
    q, k, v, _ = qkv(10, 12, batch=1)
    segments = jnp.ones((1, 10), jnp.int32)
    with pytest.raises(ValueError, match="causal self-attention needs as many queries as keys"):
        attention(q, k, v, segments, jnp.ones((1, 12), jnp.int32), causal=True, scale=SCALE)
    with pytest.raises(ValueError, match=r"segment ids \(1, 10\) / \(1, 10\) must be"):
        attention(q, k, v, segments, segments, causal=False, scale=SCALE)
    with pytest.raises(ValueError, match="model.attention='flash' is not an attention implementation"):
        AttentionConfig("flash")
    with pytest.raises(ValueError, match="model.attention_block_kv must be a positive integer, got 0"):
        AttentionConfig("blockwise", 64, 0)
    with pytest.raises(ValueError, match="model.attention_block_q to be a multiple of 128, got 100"):
        attention(
            q,
            k,
            v,
            segments,
            jnp.ones((1, 12), jnp.int32),
            causal=False,
            scale=SCALE,
            config=AttentionConfig("splash", 100, 128),
        )


def test_from_config_reads_the_model_section():
    section = ml_collections.ConfigDict({"attention": "dense", "attention_block_q": 64, "attention_block_kv": 32})
    assert wiring.attention_config(section) == AttentionConfig("dense", 64, 32)


def test_model_logits_with_images_are_the_same_for_dense_and_blockwise_attention():
    grids = [(1, 10, 12), (1, 4, 8)]  # two images: window blocks and full blocks over two frames
    ids, mask = right_padded(
        text(2, 40) + image_tokens(grids[0]) + text(3, 41) + image_tokens(grids[1]) + text(2, 42), length=60
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values": patches(TINY, grids, 43),
        "image_grid_thw": np.array(grids),
    }
    params = init_params(TINY, seed=1)
    run = lambda config: np.asarray(logits(TINY.replace(attention=config), params, inputs))[mask.astype(bool)]
    dense, blockwise = run(AttentionConfig("dense")), run(AttentionConfig("blockwise", 16, 16))
    assert np.abs(dense).max() > 0.1
    np.testing.assert_allclose(blockwise, dense, atol=1e-5, rtol=0)


def segment_of_tokens(lengths, offsets, length):
    """[B, T] segment number (1..M, 0 outside) of each token under cuDNN's packed layout."""
    position = jnp.arange(length)[None, None, :]
    start, size = offsets[:, :-1, None], lengths[:, :, None]
    inside = (size > 0) & (position >= start) & (position < start + size)
    return jnp.sum(inside * jnp.arange(1, lengths.shape[1] + 1)[None, :, None], axis=1)


def fake_packed_kernel(calls, output="dense"):
    """Stands in for cuDNN's packed-layout kernel on CPU, with its documented contract: the
    output outside every segment is undefined (NaN here); fewer kv heads than query heads
    only where jax converts their offsets right."""

    def kernel(q, k, v, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, mask_type, qkv_layout):
        assert qkv_layout == "BTNH" and (k.shape[2] == q.shape[2] or attention_module.cudnn_packed_gqa_safe())
        calls.append((mask_type.name, k.shape[2]))
        q_seg = segment_of_tokens(q_seqlen, q_offsets, q.shape[1])
        kv_seg = segment_of_tokens(kv_seqlen, kv_offsets, k.shape[1])
        causal = mask_type.name == "PADDING_CAUSAL"
        out = attention_module.dense_attention(
            attention_module.query_groups(q, k.shape[2]),
            k.transpose(0, 2, 1, 3),
            v.transpose(0, 2, 1, 3),
            q_seg,
            kv_seg,
            causal=causal,
            scale=scale,
        )
        out = out.transpose(0, 3, 1, 2, 4).reshape(q.shape)
        if output == "zeros":
            out = jnp.zeros_like(out)
        return jnp.where((q_seg != 0)[:, :, None, None], out, jnp.nan).astype(q.dtype)

    return kernel


@pytest.fixture
def cpu_as_gpu_with_fake_cudnn(monkeypatch):
    """The cuDNN path on CPU: the backend reads "gpu" and the packed kernel is the fake (the
    jitted test step traced afresh, so that it sees the fake)."""
    calls = []
    monkeypatch.setattr(attention_module.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention_module._cudnn_fused, "dot_product_attention", fake_packed_kernel(calls))
    output_and_grads.clear_cache()
    yield calls
    output_and_grads.clear_cache()


def test_packed_segments_give_each_run_its_offset_and_length():
    lengths, offsets, ids, fits = attention_module.packed_segments(jnp.asarray(PACKED, jnp.int32), 4)
    np.testing.assert_array_equal(np.asarray(lengths), [[20, 30, 15, -1], [60, -1, -1, -1], [-1] * 4])
    np.testing.assert_array_equal(np.asarray(offsets), [[0, 20, 50, -1, -1], [5, -1, -1, -1, -1], [-1] * 5])
    np.testing.assert_array_equal(np.asarray(ids), [[1, 2, 3, 0], [4, 0, 0, 0], [0] * 4])
    assert bool(fits)


@pytest.mark.parametrize(
    "row, max_segments",
    [
        ([1, 1, 0, 1, 1], 4),  # one id in two runs: the runs would not see each other
        ([2, 2, 1, 1, 0], 4),  # ids not increasing: the same id could come back
        ([1, 2, 3, 4, 5], 4),  # more runs than the compiled number of segments
        ([0, 0, 0, 0, 0], 4),  # no segment at all
    ],
)
def test_packed_segments_reject_what_the_layout_cannot_express(row, max_segments):
    assert not bool(attention_module.packed_segments(jnp.asarray([row], jnp.int32), max_segments)[3])


@pytest.mark.skipif(not attention_module.cudnn_packed_layout_available(), reason="needs jax's packed cuDNN layout")
@pytest.mark.parametrize("causal, gqa_safe", [(True, True), (True, False), (False, True)])
def test_cudnn_path_on_the_packed_layout_matches_dense(cpu_as_gpu_with_fake_cudnn, monkeypatch, causal, gqa_safe):
    monkeypatch.setattr(attention_module, "cudnn_packed_gqa_safe", lambda: gqa_safe)
    q, k, v, weights = qkv(75, 75, dtype=jnp.bfloat16)
    segments = jnp.asarray(PACKED)
    dense = output_and_grads(AttentionConfig("dense"), q, k, v, weights, segments, segments, causal)
    got = output_and_grads(AttentionConfig("cudnn", 16, 16), q, k, v, weights, segments, segments, causal)
    kv_heads = 2 if gqa_safe else 4  # qkv(): 4 query heads, 2 kv heads, repeated where jax needs it
    assert cpu_as_gpu_with_fake_cudnn == [("PADDING_CAUSAL" if causal else "PADDING", kv_heads)] * 2  # fwd, grad
    for name, expected, actual in zip(("out", "dq", "dk", "dv"), (dense[0], *dense[1]), (got[0], *got[1])):
        actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
        assert np.all(np.isfinite(actual)), name  # nothing of the kernel's undefined padding leaks
        np.testing.assert_allclose(actual, expected, atol=0.02 * np.abs(expected).max(), rtol=0, err_msg=name)
    assert np.all(np.asarray(got[0])[PACKED == 0] == 0)


@pytest.mark.skipif(not attention_module.cudnn_packed_layout_available(), reason="needs jax's packed cuDNN layout")
def test_cudnn_path_takes_the_blockwise_kernel_for_rows_the_layout_cannot_express(monkeypatch):
    monkeypatch.setattr(attention_module.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention_module._cudnn_fused, "dot_product_attention", fake_packed_kernel([], "zeros"))
    output_and_grads.clear_cache()
    q, k, v, weights = qkv(40, 40, batch=1, dtype=jnp.bfloat16)
    segments = jnp.asarray([np.repeat([1, 0, 1, 2], [10, 5, 15, 10])])  # id 1 in two runs
    dense = output_and_grads(AttentionConfig("dense"), q, k, v, weights, segments, segments, True)
    got = output_and_grads(AttentionConfig("cudnn", 16, 16), q, k, v, weights, segments, segments, True)
    for expected, actual in zip((dense[0], *dense[1]), (got[0], *got[1])):
        expected = np.asarray(expected, np.float32)
        np.testing.assert_allclose(np.asarray(actual, np.float32), expected, atol=0.02 * np.abs(expected).max())


def array_shapes(jaxpr):
    """Shapes of every value a jaxpr and the jaxprs inside it (cond branches, custom vjps,
    scans) compute."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(getattr(var.aval, "shape", ())) for var in eqn.outvars]
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    shapes += array_shapes(inner)
    return shapes


@pytest.mark.skipif(not attention_module.cudnn_packed_layout_available(), reason="needs jax's packed cuDNN layout")
def test_cudnn_path_never_builds_a_t_by_s_array(monkeypatch):
    monkeypatch.setattr(attention_module.jax, "default_backend", lambda: "gpu")

    def opaque_kernel(q, k, v, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, mask_type, qkv_layout):
        return q * jnp.sum(k[:, :1] * v[:, :1])

    monkeypatch.setattr(attention_module._cudnn_fused, "dot_product_attention", opaque_kernel)
    t = 256
    q, k, v, weights = qkv(t, t, batch=1, dtype=jnp.bfloat16)
    segments = jnp.asarray([np.repeat([1, 2, 0], [100, 120, 36])])
    loss = lambda q, k, v: jnp.sum(
        attention(
            q, k, v, segments, segments, causal=True, scale=SCALE, config=AttentionConfig("cudnn", 64, 64)
        ).astype(jnp.float32)
        * weights
    )
    shapes = array_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr)
    assert any(shape[:2] == (1, t) for shape in shapes)  # the walk sees the attention's arrays
    assert not [shape for shape in shapes if sum(d == t for d in shape) >= 2]
