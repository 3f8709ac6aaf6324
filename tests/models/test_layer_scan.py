"""Stacked layers: one leading "layers" axis, a scan equal to the layer-by-layer loop, and
remat policies that change memory, never values or gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pyvision_jax.models.layer_scan import REMAT_POLICIES, check_remat, scan_layers, stacked


def make_stack(count: int = 3) -> nnx.Module:
    return stacked(count, lambda rngs: nnx.Linear(4, 4, rngs=rngs), nnx.Rngs(0))


def loop_reference(stack: nnx.Module, x: jax.Array) -> jax.Array:
    kernel, bias = stack.kernel[...], stack.bias[...]
    for layer in range(kernel.shape[0]):
        x = jnp.tanh(x @ kernel[layer] + bias[layer])
    return x


def scanned(stack: nnx.Module, x: jax.Array, remat: str) -> jax.Array:
    return scan_layers(stack, lambda layer, h, _: (jnp.tanh(layer(h)), None), x, remat=remat)[0]


def test_stack_has_a_leading_layers_axis_with_independent_layers():
    stack = make_stack()
    assert stack.kernel.shape == (3, 4, 4)
    assert not np.allclose(stack.kernel[0], stack.kernel[1])


@pytest.mark.parametrize("remat", sorted(REMAT_POLICIES))
def test_scan_and_its_gradient_equal_the_loop_under_every_policy(remat):
    stack = make_stack()
    x = jax.random.normal(jax.random.key(1), (2, 4))
    graphdef, state = nnx.split(stack)
    loss = lambda fn: lambda s: jnp.sum(fn(nnx.merge(graphdef, s), x) ** 2)  # noqa: E731
    want, want_grad = jax.value_and_grad(loss(loop_reference))(state)
    got, got_grad = jax.jit(jax.value_and_grad(loss(lambda m, h: scanned(m, h, remat))))(state)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_unknown_remat_policy_names_the_field():
    with pytest.raises(ValueError, match="model.remat='sometimes'"):
        check_remat("sometimes", "model.remat")
