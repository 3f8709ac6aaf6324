"""The decoder MLP's hand-written gradient against autodiff of its formula and numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from pyvision_jax.models.text import swiglu_mlp


def formula(x, w_gate, w_up, w_down):
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def draw(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes]


@pytest.mark.parametrize("lead", [(7,), (2, 5), (3, 1, 4)])
def test_value_and_gradient_equal_autodiff_of_the_formula(lead):
    x, w_gate, w_up, w_down, weights = draw(len(lead), lead + (8,), (8, 12), (8, 12), (12, 8), lead + (8,))
    np.testing.assert_allclose(
        swiglu_mlp(x, w_gate, w_up, w_down), formula(x, w_gate, w_up, w_down), rtol=1e-6, atol=1e-6
    )
    ours = jax.grad(lambda *a: jnp.sum(swiglu_mlp(*a) * weights), argnums=(0, 1, 2, 3))(x, w_gate, w_up, w_down)
    reference = jax.grad(lambda *a: jnp.sum(formula(*a) * weights), argnums=(0, 1, 2, 3))(x, w_gate, w_up, w_down)
    for name, a, b in zip(["x", "w_gate", "w_up", "w_down"], ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


def test_gradient_passes_a_numerical_check():
    args = draw(7, (3, 4), (4, 6), (4, 6), (6, 4))
    check_grads(swiglu_mlp, args, order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def test_gradient_under_jit_keeps_the_parameter_dtypes():
    x, w_gate, w_up, w_down = draw(3, (2, 3, 8), (8, 12), (8, 12), (12, 8))
    bf16 = [a.astype(jnp.bfloat16) for a in (x, w_gate, w_up, w_down)]
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(swiglu_mlp(*a).astype(jnp.float32)), argnums=(0, 1, 2, 3)))(*bf16)
    assert [g.dtype for g in grads] == [jnp.bfloat16] * 4
    assert all(g.shape == a.shape for g, a in zip(grads, bf16))
