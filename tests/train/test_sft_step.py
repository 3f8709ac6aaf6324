"""The SFT step: token-mean cross-entropy on assistant tokens only, against a direct
full-logits computation, exact under micro-batching, and an update that lowers the loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.models import forward, param_logical_axes
from pyvision_jax.models.qwen2_5_vl import ModelInputs
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, pack_batch
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.sft_step import make_sft_step, sft_loss_and_grads
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig

STEP = StepConfig(logprob_chunk=16)


def packed(config, trajectories, micro_batch):
    return pack_batch(config, trajectories, np.zeros(len(trajectories)), BatchingConfig((64, 128), micro_batch))


def direct_nll(config, params, batch):
    """-mean logprob over loss tokens from the full logits of each row (no chunking)."""
    total, count = 0.0, 0.0
    for m in range(batch.num_micro_batches):
        layout = jax.tree.map(lambda x, m=m: x[m], batch.layout)
        inputs = ModelInputs(
            batch.input_ids[m], batch.attention_mask[m], batch.positions[m], batch.pixel_values[m], layout
        )
        logits = forward(config, "float32", params, inputs)[0]
        logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), batch.input_ids[m][:, 1:, None], -1)[..., 0]
        mask = (batch.loss_mask[m] & batch.attention_mask[m])[:, 1:]
        total, count = total - jnp.sum(jnp.where(mask, logprobs, 0.0)), count + jnp.sum(mask)
    return total / count


def test_loss_and_gradient_match_the_direct_computation(tiny_config, tiny_params, trajectories):
    batch, stats = packed(tiny_config, trajectories, 4)
    loss, grads, count = jax.jit(sft_loss_and_grads, static_argnums=(0, 1))(tiny_config, STEP, tiny_params, batch)
    trainable = {k: v for k, v in tiny_params.items() if k != "visual"}
    want_loss, want_grads = jax.value_and_grad(
        lambda t: direct_nll(tiny_config, {**t, "visual": tiny_params["visual"]}, batch)
    )(trainable)
    assert float(count) == stats.loss_tokens == sum(int(t.loss_mask.sum()) for t in trajectories)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7)


def test_micro_batches_and_padding_do_not_change_the_loss(tiny_config, tiny_params, trajectories):
    run = jax.jit(sft_loss_and_grads, static_argnums=(0, 1))
    whole, grads_whole, _ = run(tiny_config, STEP, tiny_params, packed(tiny_config, trajectories, 4)[0])
    split, grads_split, _ = run(tiny_config, STEP, tiny_params, packed(tiny_config, trajectories, 3)[0])
    np.testing.assert_allclose(whole, split, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads_whole), jax.tree.leaves(grads_split)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)


def test_prompt_and_tool_tokens_carry_no_loss(tiny_config, tiny_params, trajectories):
    batch, _ = packed(tiny_config, trajectories, 4)
    changed = batch.replace(input_ids=jnp.where(batch.loss_mask, batch.input_ids, (batch.input_ids + 1) % 1900))
    run = jax.jit(sft_loss_and_grads, static_argnums=(0, 1))
    base_count = run(tiny_config, STEP, tiny_params, batch)[2]
    assert float(run(tiny_config, STEP, tiny_params, changed)[2]) == float(base_count)
    no_loss = batch.replace(loss_mask=jnp.zeros_like(batch.loss_mask))
    loss, grads, count = run(tiny_config, STEP, tiny_params, no_loss)
    assert float(count) == 0 and float(loss) == 0
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads))


def test_steps_lower_the_loss_and_leave_the_vision_tower(tiny_config, tiny_params, trajectories):
    mesh = make_mesh(1, 1, 1)
    optimizer = make_optimizer(OptimizerConfig(lr=3e-3, weight_decay=0.0))
    init = functools.partial(init_train_state, optimizer=optimizer, seed=0)
    shardings = state_shardings(jax.eval_shape(init, tiny_params), param_logical_axes(tiny_config), mesh)
    state = jax.jit(init, out_shardings=shardings)(jax.tree.map(jnp.copy, tiny_params))
    step = make_sft_step(tiny_config, STEP, optimizer, mesh, shardings)
    batch = shard_batch(packed(tiny_config, trajectories, 2)[0], mesh)
    losses = []
    for _ in range(4):
        state, out = step(state, batch)
        losses.append(float(out["loss"]))
    assert losses[-1] < losses[0] - 0.05
    assert int(state.step) == 4
    for got, want in zip(jax.tree.leaves(state.params["visual"]), jax.tree.leaves(tiny_params["visual"])):
        np.testing.assert_array_equal(got, want)
