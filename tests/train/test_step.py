"""The train step: chunked logprobs and gradients against a direct full-logits computation,
exact micro-batch accumulation, the frozen vision tower and the non-finite guard."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.base import get_config as base_config
from pyvision_jax import wiring
from pyvision_jax.models import forward, param_logical_axes
from pyvision_jax.models.qwen2_5_vl import ModelInputs
from pyvision_jax.rl.losses import PPOLossConfig, ppo_loss
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, path_means, state_shardings
from pyvision_jax.train.step import (
    StepConfig,
    loss_and_grads,
    make_train_step,
    micro_batch_logprobs,
    updates_per_step,
)

ADVANTAGES = [0.7, -0.4, 1.1, -0.9]
STEP = StepConfig(
    temperature=0.7,
    logprob_chunk=16,
    old_logprobs="behaviour",
    loss=PPOLossConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0),
)


def packed(config, trajectories, micro_batch):
    return pack_batch(config, trajectories, ADVANTAGES, BatchingConfig((64, 128), micro_batch))


def direct_loss(config, params, batch, step_config):
    """The loss over the whole batch from the model's full [B, T, V] logits, no chunking."""
    total, denominator = 0.0, 0.0
    for m in range(batch.num_micro_batches):
        layout = jax.tree.map(lambda x, m=m: x[m], batch.layout)
        inputs = ModelInputs(
            batch.input_ids[m], batch.attention_mask[m], batch.positions[m], batch.pixel_values[m], layout
        )
        logits = forward(config, "float32", params, inputs)[0] / step_config.temperature
        logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), batch.input_ids[m][:, 1:, None], -1)[..., 0]
        logprobs = jnp.pad(logprobs, ((0, 0), (1, 0)))
        mask = batch.loss_mask[m] & batch.attention_mask[m]
        behaviour = batch.behaviour_logprobs[m]
        old = jax.lax.stop_gradient(logprobs) if step_config.old_logprobs == "current" else behaviour
        out = ppo_loss(logprobs, old, batch.advantages[m], mask, step_config.loss, behaviour_logprobs=behaviour)
        total, denominator = total + out.loss_sum, denominator + out.denominator
    return total / denominator


def test_chunked_loss_and_gradient_match_the_direct_computation(tiny_config, tiny_params, trajectories):
    batch, stats = packed(tiny_config, trajectories, 4)
    assert stats.length == 64 and stats.images == 6
    loss, grads, denominator, _ = jax.jit(loss_and_grads, static_argnums=(0, 1))(tiny_config, STEP, tiny_params, batch)
    trainable = {k: v for k, v in tiny_params.items() if k != "visual"}
    expected_loss, expected_grads = jax.value_and_grad(
        lambda t: direct_loss(tiny_config, {**t, "visual": tiny_params["visual"]}, batch, STEP)
    )(trainable)
    assert float(denominator) == stats.loss_tokens
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert set(grads) == {"model", "lm_head"}
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7)
    assert float(optax_norm(grads)) > 0


def optax_norm(tree):
    return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree)))


def test_micro_batch_accumulation_equals_the_full_batch(tiny_config, tiny_params, trajectories):
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    full = fn(tiny_config, STEP, tiny_params, packed(tiny_config, trajectories, 4)[0])
    split = fn(tiny_config, STEP, tiny_params, packed(tiny_config, trajectories, 1)[0])
    np.testing.assert_allclose(full[0], split[0], rtol=1e-5)
    assert float(full[2]) == float(split[2])
    for a, b in zip(jax.tree.leaves(full[1]), jax.tree.leaves(split[1])):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)


def test_packed_rows_give_the_loss_and_gradients_of_unpacked_rows(tiny_config, tiny_params, trajectories):
    """Per-sequence aggregation and sequence-level importance ratios see each packed
    trajectory alone; the packed side also runs the layer scan under a remat policy."""
    loss = PPOLossConfig(aggregation="seq-mean-token-mean", importance_sampling="sequence")
    plain_config = dataclasses.replace(STEP, loss=loss, old_logprobs="current")
    packed_config = dataclasses.replace(plain_config, remat="save_dots")
    plain, _ = pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((128,), 2))
    packed, stats = pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((128,), 2, pack=True))
    assert packed.input_ids.shape[:2] == (1, 2) and plain.input_ids.shape[:2] == (2, 2)
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    want = fn(tiny_config, plain_config, tiny_params, plain)
    got = fn(tiny_config, packed_config, tiny_params, packed)
    assert float(got[2]) == float(want[2]) == 4  # four sequences with loss tokens
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert float(got[3].token_count) == float(want[3].token_count) == stats.loss_tokens
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)
    assert float(optax_norm(got[1])) > 0


def test_a_shape_floor_pads_the_batch_without_changing_loss_or_gradients(tiny_config, tiny_params, trajectories):
    """The trainer holds batches at the largest shape seen (fewer compiles): the padding
    micro-batches, segments, vision windows and merged slots carry nothing."""
    config = BatchingConfig((128,), 2, pack=True)
    bare, bare_stats = pack_batch(tiny_config, trajectories, ADVANTAGES, config)
    floor = BatchShape(
        micro_batches=3, segments=6, windows=bare_stats.shape.windows * 2, merged=bare_stats.shape.merged * 2
    )
    padded, stats = pack_batch(tiny_config, trajectories, ADVANTAGES, config, floor)
    assert stats.shape == floor and bare_stats.shape.cover(floor) == floor
    assert padded.input_ids.shape[:2] == (3, 2) and padded.advantages.shape == (3, 2, 6)
    assert padded.layout.merged_index.shape[1] == floor.merged
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    want = fn(tiny_config, STEP, tiny_params, bare)
    got = fn(tiny_config, STEP, tiny_params, padded)
    assert float(got[2]) == float(want[2]) == stats.loss_tokens
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)


def test_the_entropy_coefficient_trains_on_the_entropy(tiny_config, tiny_params, trajectories):
    """With zero advantages the loss is -entropy_coef x the token-mean entropy, and a step
    down its gradient lowers the entropy when the coefficient is negative."""
    batch, stats = pack_batch(tiny_config, trajectories, [0.0] * 4, BatchingConfig((64, 128), 4))
    config = dataclasses.replace(STEP, loss=PPOLossConfig(entropy_coef=-1.0))
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    loss, grads, _, metrics = fn(tiny_config, config, tiny_params, batch)
    mean_entropy = float(metrics.entropy_sum / metrics.token_count)
    np.testing.assert_allclose(float(loss), mean_entropy, rtol=1e-5)
    assert float(optax_norm(grads)) > 0
    stepped = {
        **tiny_params,
        **jax.tree.map(lambda p, g: p - 0.5 * g / optax_norm(grads), {k: tiny_params[k] for k in grads}, grads),
    }
    after = fn(tiny_config, config, stepped, batch)[3]
    assert float(after.entropy_sum / after.token_count) < mean_entropy


@pytest.fixture(scope="module")
def step_setup(tiny_config, tiny_params):
    optimizer = make_optimizer(OptimizerConfig(lr=1e-3, weight_decay=0.01, grad_clip=1.0))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    state = init_train_state(tiny_params, optimizer, seed=0)
    shardings = state_shardings(state, param_logical_axes(tiny_config), mesh)
    step = make_train_step(tiny_config, STEP, optimizer, mesh, shardings, donate=False)
    return jax.device_put(state, shardings), step, mesh


def test_step_updates_the_decoder_and_leaves_the_vision_tower_bit_identical(tiny_config, trajectories, step_setup):
    state, step, mesh = step_setup
    batch = shard_batch(packed(tiny_config, trajectories, 2)[0], mesh)
    new_state, out = step(state, batch)
    assert int(new_state.step) == 1 and float(out["updated"]) == 1.0 and float(out["grad_norm"]) > 0
    for old, new in zip(jax.tree.leaves(state.params["visual"]), jax.tree.leaves(new_state.params["visual"])):
        assert np.asarray(old).tobytes() == np.asarray(new).tobytes()
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(state.params["model"]), jax.tree.leaves(new_state.params["model"]))
    ]
    assert all(changed)


def test_non_finite_gradient_skips_the_update_and_counts_it(tiny_config, trajectories, step_setup):
    state, step, mesh = step_setup
    host, _ = packed(tiny_config, trajectories, 2)
    host = host.replace(advantages=np.full_like(host.advantages, np.nan))
    new_state, out = step(state, shard_batch(host, mesh))
    assert float(out["nonfinite"]) == 1.0 and int(new_state.skipped_updates) == 1 and int(new_state.step) == 1
    for old, new in zip(jax.tree.leaves(state.params), jax.tree.leaves(new_state.params)):
        assert np.array_equal(old, new)
    for old, new in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(new_state.opt_state)):
        assert np.array_equal(old, new)


def test_a_batch_without_loss_tokens_steps_without_changing_params(tiny_config, trajectories, step_setup):
    state, step, mesh = step_setup
    host, _ = packed(tiny_config, trajectories, 2)
    host = host.replace(loss_mask=np.zeros_like(host.loss_mask))
    new_state, out = step(state, shard_batch(host, mesh))
    assert int(new_state.step) == 1 and float(out["updated"]) == 0.0 and float(out["loss_tokens"]) == 0
    for old, new in zip(jax.tree.leaves(state.params), jax.tree.leaves(new_state.params)):
        assert np.array_equal(old, new)


def test_truncated_is_needs_the_proximal_policy_and_comes_from_the_rl_config():
    rl = base_config().rl
    rl.importance_sampling, rl.is_truncation = "sequence", 1.5
    loss = wiring.loss_config(rl)
    assert (loss.importance_sampling, loss.is_truncation) == ("sequence", 1.5)
    assert StepConfig(loss=loss, old_logprobs="current").loss is loss
    with pytest.raises(ValueError, match="needs old_logprobs='current'"):
        StepConfig(loss=loss, old_logprobs="behaviour")


def test_truncated_is_weighs_each_token_by_the_capped_behaviour_to_proximal_ratio(
    tiny_config, tiny_params, trajectories
):
    batch, _ = pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((64, 128), 4, pack=False))
    config = StepConfig(
        temperature=0.7,
        logprob_chunk=16,
        old_logprobs="current",
        loss=PPOLossConfig(importance_sampling="token", is_truncation=1.2),
    )
    loss, grads, _, metrics = jax.jit(loss_and_grads, static_argnums=(0, 1))(tiny_config, config, tiny_params, batch)
    np.testing.assert_allclose(loss, direct_loss(tiny_config, tiny_params, batch, config), rtol=1e-5)
    plain = jax.jit(loss_and_grads, static_argnums=(0, 1))(
        tiny_config, dataclasses.replace(config, loss=PPOLossConfig()), tiny_params, batch
    )[0]
    assert abs(float(loss) - float(plain)) > 1e-4 and float(metrics.is_ratio_max) != 1.0


def test_ppo_epochs_are_successive_updates_against_the_fixed_behaviour_logprobs(tiny_config, trajectories, step_setup):
    """Three epochs in one step equal three single-update steps on the same batch (the ratio's
    denominator stays the engine's) and advance the counter once."""
    state, single, mesh = step_setup
    optimizer = make_optimizer(OptimizerConfig(lr=1e-3, weight_decay=0.01, grad_clip=1.0))
    shardings = state_shardings(state, param_logical_axes(tiny_config), mesh)
    epochs = make_train_step(
        tiny_config, dataclasses.replace(STEP, ppo_epochs=3), optimizer, mesh, shardings, donate=False
    )
    batch = shard_batch(packed(tiny_config, trajectories, 2)[0], mesh)
    stepped, first = single(state, batch)
    for _ in range(2):
        stepped, last = single(stepped, batch)
    got, out = epochs(state, batch)
    assert int(got.step) == 1 and int(stepped.step) == 3
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(stepped.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out["grad_norm"], first["grad_norm"], rtol=1e-5)  # of the first update
    np.testing.assert_allclose(out["clip_fraction"], last["clip_fraction"], rtol=1e-5, atol=1e-7)  # of the last
    with pytest.raises(ValueError, match="train.ppo_epochs=2.*old_logprobs='behaviour'"):
        StepConfig(old_logprobs="current", ppo_epochs=2)


def test_lr_multipliers_scale_the_update_of_matching_parameters_only():
    params = {"model": {"norm": {"scale": jnp.ones(4)}, "layers": {"kernel": jnp.ones((2, 4))}}}
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
    updates = {}
    for factor in (1.0, 10.0):
        config = OptimizerConfig(lr=1e-3, weight_decay=0.0, lr_multipliers=(("model/norm", factor),))
        optimizer = make_optimizer(config)
        updates[factor], _ = optimizer.update(grads, optimizer.init(params), params)
    np.testing.assert_allclose(
        updates[10.0]["model"]["norm"]["scale"], 10.0 * updates[1.0]["model"]["norm"]["scale"], rtol=1e-6
    )
    np.testing.assert_array_equal(updates[10.0]["model"]["layers"]["kernel"], updates[1.0]["model"]["layers"]["kernel"])
    train = base_config().train
    train.lr_multipliers = ("model/norm/scale=30",)
    assert wiring.optimizer_config(train, ()).lr_multipliers == (("model/norm/scale", 30.0),)
    train.lr_multipliers = ("model/norm",)
    with pytest.raises(ValueError, match="REGEX=FACTOR"):
        wiring.optimizer_config(train, ())
    with pytest.raises(ValueError, match="not a regex"):
        OptimizerConfig(lr_multipliers=(("model/(norm", 2.0),))


def test_uniform_updates_move_every_entry_of_matching_parameters_by_one_shared_amount():
    params = {"model": {"norm": {"scale": jnp.ones(4)}, "layers": {"kernel": jnp.ones((2, 4))}}}
    grads = {
        "model": {
            "norm": {"scale": jnp.array([0.4, -0.1, 0.2, 0.3])},
            "layers": {"kernel": jnp.array([[0.4, -0.1, 0.2, 0.3]] * 2)},
        }
    }
    config = OptimizerConfig(lr=1e-2, weight_decay=0.0, grad_clip=0.0, uniform_updates=("model/norm",))
    optimizer = make_optimizer(config)
    state = optimizer.init(params)
    for _ in range(3):
        updates, state = optimizer.update(grads, state, params)
    scale = np.asarray(updates["model"]["norm"]["scale"])
    np.testing.assert_allclose(scale, np.full(4, scale[0]), rtol=1e-6)
    assert scale[0] < 0  # the mean gradient (0.2) is positive: every entry moves down
    plain_optimizer = make_optimizer(dataclasses.replace(config, uniform_updates=()))
    plain = np.asarray(plain_optimizer.update(grads, plain_optimizer.init(params), params)[0]["model"]["norm"]["scale"])
    assert plain[1] > 0 > plain[0]  # without it, entries follow their own gradient's sign
    kernel = np.asarray(updates["model"]["layers"]["kernel"])
    assert kernel[0, 1] > 0 > kernel[0, 0]
    train = base_config().train
    train.uniform_updates = ("model/norm/scale",)
    assert wiring.optimizer_config(train, ()).uniform_updates == ("model/norm/scale",)
    with pytest.raises(ValueError, match="uniform_updates.*not a regex"):
        OptimizerConfig(uniform_updates=("model/(norm",))


def test_path_means_are_the_means_of_the_matching_parameters_only():
    params = {
        "model": {
            "norm": {"scale": jnp.array([1.0, 2.0, 4.0, 5.0])},
            "layers": {"norm": {"scale": jnp.ones((2, 4))}, "kernel": jnp.zeros((2, 4))},
        }
    }
    means = path_means(params, ("^model/norm/scale$", "kernel"))
    assert sorted(means) == ["model/layers/kernel", "model/norm/scale"]
    assert float(means["model/norm/scale"]) == 3.0 and float(means["model/layers/kernel"]) == 0.0
    assert path_means(params, ()) == {}


def test_the_per_unit_token_mean_does_not_depend_on_micro_batches_packing_or_devices(
    tiny_config, tiny_params, trajectories
):
    """token-mean-per-micro-batch over units of 2 trajectories (the released per-device
    micro-batch): the mean of the units' token means, however rows fall into the step's
    micro-batches; with the step's micro-batch as the unit the loss moves with the layout."""
    config = StepConfig(
        temperature=0.7,
        logprob_chunk=16,
        old_logprobs="current",
        loss=PPOLossConfig(aggregation="token-mean-per-micro-batch"),
    )
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    layouts = [
        BatchingConfig((128,), 4, loss_unit=2),
        BatchingConfig((128,), 1, loss_unit=2),
        BatchingConfig((128,), 2, pack=True, loss_unit=2),
    ]
    results = [
        fn(tiny_config, config, tiny_params, pack_batch(tiny_config, trajectories, ADVANTAGES, layout)[0])
        for layout in layouts
    ]
    tokens = [int(t.loss_mask.sum()) for t in trajectories]
    # at ratio 1 every token's loss is -A: a unit's mean is -sum(A n) / sum(n)
    units = [
        -(ADVANTAGES[i] * tokens[i] + ADVANTAGES[j] * tokens[j]) / (tokens[i] + tokens[j]) for i, j in ((0, 1), (2, 3))
    ]
    for loss, grads, denominator, _ in results:
        np.testing.assert_allclose(loss, np.mean(units), rtol=1e-5)
        assert float(denominator) == pytest.approx(2.0)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(results[0][1])):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)
    per_step = [
        fn(
            tiny_config,
            config,
            tiny_params,
            pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((128,), m))[0],
        )[0]
        for m in (4, 1)
    ]
    np.testing.assert_allclose(per_step, [-np.dot(ADVANTAGES, tokens) / sum(tokens), -np.mean(ADVANTAGES)], rtol=1e-5)


def test_mini_batches_are_successive_updates_on_disjoint_halves_against_the_step_start_policy(
    tiny_config, trajectories, step_setup
):
    """Two mini-batches: one step makes two updates, the second off-policy, each on its half,
    both with the policy before the step as the ratio's denominator; one mini-batch is one
    update on the whole batch."""
    state, single, mesh = step_setup
    optimizer = make_optimizer(OptimizerConfig(lr=1e-3, weight_decay=0.01, grad_clip=1.0))
    shardings = state_shardings(state, param_logical_axes(tiny_config), mesh)
    current = dataclasses.replace(STEP, old_logprobs="current")
    halves = make_train_step(
        tiny_config, dataclasses.replace(current, mini_batches=2), optimizer, mesh, shardings, donate=False
    )
    host, _ = pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((64, 128), 2, mini_batches=2))
    assert host.input_ids.shape[:2] == (2, 2)
    got, out = halves(state, shard_batch(host, mesh))
    assert int(got.step) == 1 and float(out["updated"]) == 1.0 and float(out["approx_kl"]) > 0

    whole, _ = pack_batch(tiny_config, trajectories, ADVANTAGES, BatchingConfig((64, 128), 4))
    start = jax.jit(micro_batch_logprobs, static_argnums=(0, 1))(
        tiny_config, current, state.params, jax.tree.map(lambda x: x[0], whole)
    )[0]
    relabelled = [
        dataclasses.replace(t, logprobs=np.where(t.loss_mask, np.asarray(start[i, : len(t.token_ids)]), 0.0))
        for i, t in enumerate(trajectories)
    ]
    stepped = state
    for half in (slice(0, 2), slice(2, 4)):
        batch, _ = pack_batch(tiny_config, relabelled[half], ADVANTAGES[half], BatchingConfig((64, 128), 2))
        stepped, _ = single(stepped, shard_batch(batch, mesh))  # behaviour logprobs = the step-start policy's
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(stepped.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    once, _ = single(state, shard_batch(packed(tiny_config, trajectories, 2)[0], mesh))  # one update, whole batch
    moved = [
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(once.params["model"]), jax.tree.leaves(got.params["model"]))
    ]
    assert max(moved) > 1e-4


def test_updates_per_step_divide_the_batch_into_mini_batches_of_groups(tiny_config):
    assert [updates_per_step(b, m) for b, m in ((16, 16), (64, 16), (16, 0))] == [1, 4, 1]
    with pytest.raises(ValueError, match="train.ppo_mini_batch_groups=5"):
        updates_per_step(16, 5)
    with pytest.raises(ValueError, match="do not split into 2"):
        pack_batch(tiny_config, [None] * 3, [0.0] * 3, BatchingConfig((64,), 1, mini_batches=2))


KL_STEP = dataclasses.replace(STEP, loss=dataclasses.replace(STEP.loss, kl_coef=0.5))


def test_kl_term_is_zero_with_its_gradient_at_the_reference_and_pulls_back_towards_it(
    tiny_config, tiny_params, trajectories
):
    batch, _ = packed(tiny_config, trajectories, 2)
    fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
    trainable = {k: v for k, v in tiny_params.items() if k != "visual"}
    plain_loss, plain_grads, _, plain_metrics = fn(tiny_config, STEP, tiny_params, batch)
    loss, grads, _, metrics = fn(tiny_config, KL_STEP, tiny_params, batch, trainable)
    # k3 = exp(r) - r - 1 and its derivative vanish at r = 0: at the reference only the PPO term acts
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(metrics.ref_kl_sum) == pytest.approx(0.0, abs=1e-6) and float(plain_metrics.ref_kl_sum) == 0.0

    moved = jax.tree.map(lambda p, g: p - 0.5 * g / optax_norm(plain_grads), trainable, plain_grads)
    params = {**tiny_params, **moved}
    away_loss, away_grads, _, away_metrics = fn(tiny_config, KL_STEP, params, batch, trainable)
    no_kl_loss, no_kl_grads, _, _ = fn(tiny_config, STEP, params, batch)
    assert float(away_metrics.ref_kl_sum) > 0 and float(away_loss) > float(no_kl_loss)
    # the KL part of the gradient points back: a small step along -grad(KL) lowers the KL
    kl_grads = jax.tree.map(jnp.subtract, away_grads, no_kl_grads)
    back = {**tiny_params, **jax.tree.map(lambda p, g: p - 0.1 * g / optax_norm(kl_grads), moved, kl_grads)}
    assert float(fn(tiny_config, KL_STEP, back, batch, trainable)[3].ref_kl_sum) < float(away_metrics.ref_kl_sum)


def test_kl_term_without_a_reference_names_the_config_key(tiny_config, tiny_params, trajectories):
    batch, _ = packed(tiny_config, trajectories, 2)
    with pytest.raises(ValueError, match="rl.kl_coef=0.5 needs the reference"):
        loss_and_grads(tiny_config, KL_STEP, tiny_params, batch)


def test_train_step_with_a_reference_reports_its_kl(tiny_config, tiny_params, trajectories):
    optimizer = make_optimizer(OptimizerConfig(lr=1e-2, weight_decay=0.0, grad_clip=1.0))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    state = init_train_state(tiny_params, optimizer, seed=0)
    shardings = state_shardings(state, param_logical_axes(tiny_config), mesh)
    step = make_train_step(tiny_config, KL_STEP, optimizer, mesh, shardings, donate=False)
    state = jax.device_put(state, shardings)
    reference = jax.device_put(
        {k: v for k, v in tiny_params.items() if k != "visual"},
        {k: v for k, v in shardings.params.items() if k != "visual"},
    )
    batch = shard_batch(packed(tiny_config, trajectories, 2)[0], mesh)
    first, out = step(state, batch, reference)
    assert float(out["ref_kl"]) == pytest.approx(0.0, abs=1e-6) and float(out["updated"]) == 1.0
    _, out = step(first, batch, reference)
    assert float(out["ref_kl"]) > 0
