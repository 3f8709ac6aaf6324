"""The params tree contract (shared with the converter) and reduced-precision runs."""

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.convert import hf as convert_hf
from pyvision_jax.models import init_params, logits, param_shapes
from tests.models.model_inputs import image_tokens, patches, text


def test_init_params_and_converter_share_the_tree(tiny_reference):
    config, _, params, hf_dir = tiny_reference
    shapes = jax.tree.map(lambda s: s.shape, param_shapes(config))
    bf16 = jax.eval_shape(lambda: init_params(config, seed=1, dtype=jnp.bfloat16))
    assert jax.tree.map(lambda s: s.shape, bf16) == shapes
    assert {x.dtype for x in jax.tree.leaves(bf16)} == {jnp.dtype(jnp.bfloat16)}
    assert bf16["visual"]["patch_embed"]["proj"]["kernel"].shape == (config.vision.patch_dim, config.vision.hidden_size)
    loaded_config, loaded = convert_hf.load_hf(hf_dir, progress=False)
    assert loaded_config == config
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_bfloat16_params_and_compute_give_float32_logits_close_to_float32(tiny_reference):
    config, _, params, _ = tiny_reference
    grid = (1, 8, 12)
    inputs = {
        "input_ids": np.array([text(3, 40) + image_tokens(grid) + text(5, 41)]),
        "pixel_values": patches(config, [grid], 42),
        "image_grid_thw": np.array([grid]),
    }
    reference = np.asarray(logits(config, params, inputs))
    half = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
    got = logits(config, half, inputs, compute_dtype=jnp.bfloat16)
    assert got.dtype == jnp.float32
    got = np.asarray(got)
    assert np.isfinite(got).all()
    error = np.abs(got - reference).max() / np.abs(reference).max()
    assert 0 < error < 0.1, error
