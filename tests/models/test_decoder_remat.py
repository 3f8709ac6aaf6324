"""The decoder's remat policies leave values and gradients unchanged, and never make the
blockwise attention's memory quadratic: remat wraps everything in a layer but the attention
kernel (under remat inside the layer scan, JAX would otherwise keep every block's scores)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.models.qwen2_5_vl import graphdef

CONFIG = ModelConfig.preset("tiny").replace(attention=AttentionConfig("blockwise", 16, 16))


def hidden_loss(remat: str, length: int):
    state = init_params(CONFIG, seed=0)
    definition = graphdef(CONFIG)

    def loss(state, embeds):
        positions = jnp.broadcast_to(jnp.arange(embeds.shape[1]), (3, *embeds.shape[:2]))
        model = nnx.merge(definition, state)
        hidden, _ = model.model(embeds, positions, jnp.ones(embeds.shape[:2], bool), remat=remat)
        return jnp.sum(hidden**2)

    embeds = jax.random.normal(jax.random.key(1), (1, length, CONFIG.hidden_size))
    return loss, state, embeds


@pytest.mark.parametrize("remat", ["full", "save_dots"])
def test_remat_keeps_values_and_gradients(remat):
    loss, state, embeds = hidden_loss("none", 48)
    want, want_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, embeds)
    loss, state, embeds = hidden_loss(remat, 48)
    got, got_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, embeds)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_remat_memory_grows_linearly_with_length():
    def temps(length):
        loss, state, embeds = hidden_loss("full", length)
        compiled = jax.jit(jax.grad(loss)).lower(state, embeds).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temps(512), temps(2048)
    assert large < 6 * small, (small, large)  # quadratic would be ~16x
