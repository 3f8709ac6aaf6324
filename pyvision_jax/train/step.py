"""The jitted, sharded GRPO train step on padded or packed [B, T] batches with images.

Shapes: a `TrainBatch` holds M micro-batches of n rows each, stacked on a leading axis
([M, n, T]; positions [M, 3, n, T]; vision arrays [M, ...]). The step scans over the
micro-batches, accumulating the gradient of each micro-batch's loss *sum* and its
denominator, and divides once at the end, so accumulation is exact (the result equals one
pass over the whole batch).

Packed rows hold several trajectories: `segment_ids` [M, n, T] number them 1..K within each
row (0 is padding), attention stays within a segment, and the loss sees each segment as its
own sequence (`segment_rows`), so packing changes neither the loss nor its gradient. A
frozen vision tower runs once per step, outside the gradient, for all micro-batches.

Per-token logprobs of the current params are computed from the decoder's hidden states in
chunks of `logprob_chunk` positions: lm_head, temperature, log-softmax and the gather run per
chunk under `jax.checkpoint`, so neither the forward nor the backward pass ever holds the
whole [n, T, V] float32 logits (`train.token_logprobs`).

Token t's logprob is read from the hidden state at t - 1, aligned with `Trajectory.loss_mask`
and the engine's logprobs (position t holds token t's values).

With `StepConfig.mini_batches` N > 1 the M micro-batches form N disjoint mini-batches of
M / N each (`train.batching` lays the rows out so), and the step makes one optimizer update
per mini-batch, in order: the released recipe's several updates per step. The ratio's
denominator is then the policy before the step for every mini-batch (with old_logprobs
"current", one forward pass over the whole batch at the step's start; "behaviour": the
engine's), so the later updates are off-policy and clipped against it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pyvision_jax.models import ModelConfig, graphdef
from pyvision_jax.models.layer_scan import check_remat
from pyvision_jax.models.sharding import shard_activation
from pyvision_jax.models.vision import VisionLayout
from pyvision_jax.rl.losses import (
    PPOLossConfig,
    PPOMetrics,
    combine_metrics,
    combine_stacked_metrics,
    empty_metrics,
    ppo_loss,
    summarize_metrics,
)
from pyvision_jax.train.state import TrainState, split_trainable
from pyvision_jax.train.token_logprobs import chunked_token_logprobs, segment_masks, segment_rows


@struct.dataclass
class TrainBatch:
    """M micro-batches of n padded rows of length T (see the module docstring)."""

    input_ids: jax.Array
    attention_mask: jax.Array
    positions: jax.Array
    loss_mask: jax.Array
    behaviour_logprobs: jax.Array
    advantages: jax.Array
    """[M, n]: one advantage per row (0 on padding rows); packed: [M, n, K], one per segment."""
    pixel_values: jax.Array | None = None
    """[M, S, patch_dim] in each micro-batch's vision layout, or None without images."""
    layout: VisionLayout | None = None
    segment_ids: jax.Array | None = None
    """Packed rows: [M, n, T] segment of each token (1..K, 0 padding); None: one per row."""
    unit_tokens: jax.Array | None = None
    """Shaped like `advantages`: loss tokens of the sequence's loss unit (a released
    micro-batch of a few trajectories, `rl.losses`); None: the micro-batch is the unit."""
    unit_share: jax.Array | None = None
    """Shaped like `advantages`: 1 / the sequences with loss tokens in its unit."""
    proximal_logprobs: jax.Array | None = None
    """[M, n, T] the ratio's denominator when set by the step itself (several mini-batches
    with old_logprobs "current": the params before the step); None on the host."""
    reference_logprobs: jax.Array | None = None
    """[M, n, T] the reference policy's logprobs for the KL term of `loss.kl_coef` > 0, set
    once per step by the step itself (every update compares against the same); None on the host."""

    @property
    def num_micro_batches(self) -> int:
        return self.input_ids.shape[0]


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the train step (hashable)."""

    loss: PPOLossConfig = PPOLossConfig()
    temperature: float = 1.0
    """Rollout temperature: logits are divided by it before the log-softmax."""
    logprob_chunk: int = 256
    """Positions per lm_head/log-softmax chunk."""
    old_logprobs: Literal["current", "behaviour"] = "current"
    """"current": the ratio's denominator is the current params' logprobs (stop-gradient):
    the proximal policy of decoupled PPO, which is what recomputing them before the single
    update per batch gives, at no extra cost; the engine's (behaviour) logprobs then enter
    only through the truncated importance weight (`loss.importance_sampling`).
    "behaviour": the engine's logprobs (classic PPO; no separate importance weight)."""
    ppo_epochs: int = 1
    """Optimizer updates per batch over the same rollouts (classic PPO epochs): rollouts cost
    far more than updates, and the clipped ratio against the fixed behaviour logprobs keeps
    the later updates near the policy that generated them. > 1 needs old_logprobs "behaviour"
    (with "current" the denominator would move with every update and nothing would clip)."""
    mini_batches: int = 1
    """Optimizer updates per epoch, one per disjoint mini-batch of M / mini_batches
    micro-batches (the released ppo_mini_batch_size; see `updates_per_step`); 1: one update
    on the whole batch."""
    compute_dtype: str = "float32"
    frozen_prefixes: tuple[str, ...] = ("visual",)
    remat: str = "none"
    """Remat policy of the decoder's layer scan (models/layer_scan.py, config key model.remat)."""

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"StepConfig.temperature must be > 0, got {self.temperature}")
        if self.logprob_chunk < 1:
            raise ValueError(f"StepConfig.logprob_chunk must be >= 1, got {self.logprob_chunk}")
        if self.old_logprobs not in ("current", "behaviour"):
            raise ValueError(f"StepConfig.old_logprobs must be 'current' or 'behaviour', got {self.old_logprobs!r}")
        if self.mini_batches < 1:
            raise ValueError(f"StepConfig.mini_batches must be >= 1, got {self.mini_batches}")
        if self.ppo_epochs < 1 or (self.ppo_epochs > 1 and self.old_logprobs != "behaviour"):
            raise ValueError(
                f"train.ppo_epochs={self.ppo_epochs}: must be >= 1, and > 1 needs "
                f"train.old_logprobs='behaviour' (got {self.old_logprobs!r})"
            )
        if self.loss.importance_sampling != "none" and self.old_logprobs != "current":
            raise ValueError(
                f"importance_sampling={self.loss.importance_sampling!r} weighs behaviour -> "
                f"proximal logprobs and needs old_logprobs='current' (got {self.old_logprobs!r}: "
                f"the weight would be identically 1)"
            )
        check_remat(self.remat, "model.remat")


# ---------------------------------------------------------------------- logprobs


def hidden_states(
    config: ModelConfig, step_config: StepConfig, params: Any, micro: TrainBatch, features: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """(normed decoder hidden states [n, T, D], lm_head kernel [D, V]) for one micro-batch;
    `features` are its vision features when computed beforehand (a frozen tower)."""
    compute_dtype = step_config.compute_dtype
    model = nnx.merge(graphdef(config, jnp.dtype(compute_dtype)), params)
    if features is None and micro.pixel_values is not None:
        features = model.visual(micro.pixel_values, micro.layout)
    embeds = model.embed(micro.input_ids, features)
    hidden, _ = model.model(
        embeds, micro.positions, micro.attention_mask, segment_ids=micro.segment_ids, remat=step_config.remat
    )
    if config.tie_word_embeddings:
        kernel = params["model"]["embed_tokens"]["embedding"].T
    else:
        kernel = params["lm_head"]["kernel"]
    return hidden, kernel.astype(jnp.dtype(compute_dtype))


def micro_batch_logprobs(
    model_config: ModelConfig,
    step_config: StepConfig,
    params: Any,
    micro: TrainBatch,
    features: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(logprobs, entropy), each [n, T], of one micro-batch (a TrainBatch without M axis)."""
    hidden, kernel = hidden_states(model_config, step_config, params, micro, features)
    hidden = shard_activation(hidden, ("batch", "length", "act_embed"))
    return chunked_token_logprobs(hidden, kernel, micro.input_ids, step_config.temperature, step_config.logprob_chunk)


def micro_batch_loss(
    model_config: ModelConfig,
    step_config: StepConfig,
    trainable: Any,
    frozen: Any,
    micro: TrainBatch,
    features: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, PPOMetrics]]:
    """(loss sum, (denominator, metrics)) of one micro-batch; differentiate w.r.t. `trainable`.

    The KL term of `loss.kl_coef` > 0 reads `micro.reference_logprobs` (`with_reference_logprobs`).
    Packed rows are split into one loss row per segment, so per-sequence terms (sequence
    aggregation, sequence importance ratios) see each trajectory alone."""
    logprobs, entropy = micro_batch_logprobs(model_config, step_config, {**trainable, **frozen}, micro, features)
    ref = None
    if step_config.loss.kl_coef:
        if micro.reference_logprobs is None:
            raise ValueError(
                f"rl.kl_coef={step_config.loss.kl_coef} needs the reference policy's logprobs "
                "(the `reference` params of loss_and_grads or train_step)"
            )
        ref = micro.reference_logprobs
    mask = micro.loss_mask & micro.attention_mask
    if micro.proximal_logprobs is not None:
        old = micro.proximal_logprobs
    elif step_config.old_logprobs == "current":
        old = jax.lax.stop_gradient(logprobs)
    else:
        old = micro.behaviour_logprobs
    behaviour, advantages = micro.behaviour_logprobs, micro.advantages
    unit_tokens, unit_share = micro.unit_tokens, micro.unit_share
    if micro.segment_ids is not None:
        k = advantages.shape[-1]
        rows = lambda values: segment_rows(values, k)  # noqa: E731
        logprobs, old, behaviour, entropy = map(rows, (logprobs, old, behaviour, entropy))
        ref = None if ref is None else rows(ref)
        mask = segment_masks(mask, micro.segment_ids, k)
        advantages = advantages.reshape(-1)
        if unit_tokens is not None:
            unit_tokens, unit_share = unit_tokens.reshape(-1), unit_share.reshape(-1)
    out = ppo_loss(
        logprobs,
        old,
        advantages,
        mask,
        step_config.loss,
        behaviour_logprobs=behaviour,
        ref_logprobs=ref,
        entropy=entropy,
        unit_tokens=unit_tokens,
        unit_share=unit_share,
    )
    return out.loss_sum, (out.denominator, out.metrics)


def frozen_vision_features(
    model_config: ModelConfig, step_config: StepConfig, params: Any, batch: TrainBatch
) -> jax.Array | None:
    """[M, merged tokens, D] vision features of every micro-batch, outside the gradient, when
    the tower is frozen and the batch has images; else None (each micro-batch runs it)."""
    if "visual" not in step_config.frozen_prefixes or batch.pixel_values is None:
        return None
    model = nnx.merge(graphdef(model_config, jnp.dtype(step_config.compute_dtype)), jax.lax.stop_gradient(params))
    return jax.lax.map(lambda args: model.visual(*args), (batch.pixel_values, batch.layout))


def loss_and_grads(
    model_config: ModelConfig, step_config: StepConfig, params: Any, batch: TrainBatch, reference: Any = None
) -> tuple[jax.Array, Any, jax.Array, PPOMetrics]:
    """(loss, grads of the trainable groups, denominator, metrics) over all micro-batches.

    loss = sum of micro-batch loss sums / sum of denominators; the gradient is that of the
    same quantity (0 when the denominator is 0). `reference`: see `train_step`.
    """
    features = frozen_vision_features(model_config, step_config, params, batch)
    batch = with_reference_logprobs(model_config, step_config, params, reference, batch, features)
    return _loss_and_grads(model_config, step_config, params, batch, features)


def _loss_and_grads(
    model_config: ModelConfig,
    step_config: StepConfig,
    params: Any,
    batch: TrainBatch,
    features: jax.Array | None,
) -> tuple[jax.Array, Any, jax.Array, PPOMetrics]:
    """`loss_and_grads` given the frozen tower's `frozen_vision_features` (the same for every
    PPO epoch: computed once per step)."""
    trainable, frozen = split_trainable(params, step_config.frozen_prefixes)
    grad_fn = jax.value_and_grad(functools.partial(micro_batch_loss, model_config, step_config), has_aux=True)

    def body(carry, inputs):
        micro, micro_features = inputs
        grads, loss_sum, denominator, metrics = carry
        (mb_loss, (mb_denominator, mb_metrics)), mb_grads = grad_fn(trainable, frozen, micro, micro_features)
        grads = jax.tree.map(jnp.add, grads, mb_grads)
        return (grads, loss_sum + mb_loss, denominator + mb_denominator, combine_metrics(metrics, mb_metrics)), None

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), empty_metrics())
    (grads, loss_sum, denominator, metrics), _ = jax.lax.scan(body, init, (batch, features))
    scale = 1.0 / jnp.maximum(denominator, 1.0)
    grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, trainable)
    return loss_sum * scale, grads, denominator, metrics


def _update(
    model_config: ModelConfig,
    step_config: StepConfig,
    optimizer: optax.GradientTransformation,
    features: jax.Array | None,
    params: Any,
    opt_state: Any,
    batch: TrainBatch,
) -> tuple[Any, Any, dict[str, Any]]:
    """One optimizer update from `batch`: (params, optimizer state, what it measured). Skipped
    (both kept) when the loss or gradient is not finite; a no-op when there is no loss token."""
    loss, grads, denominator, metrics = _loss_and_grads(model_config, step_config, params, batch, features)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    apply = finite & (denominator > 0)
    trainable, frozen = split_trainable(params, step_config.frozen_prefixes)
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, new_opt_state = optimizer.update(safe_grads, opt_state, trainable)
    new_trainable = optax.apply_updates(trainable, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)  # noqa: E731
    new_params = {**keep(new_trainable, trainable), **frozen}
    measured = {
        "loss": loss,
        "grad_norm": grad_norm,
        "denominator": denominator,
        "metrics": metrics,
        "finite": finite,
        "apply": apply,
    }
    return {k: new_params[k] for k in params}, keep(new_opt_state, opt_state), measured


def updates_per_step(batch_groups: int, mini_batch_groups: int) -> int:
    """`StepConfig.mini_batches` of a step of `batch_groups` groups trained in mini-batches of
    `mini_batch_groups` (0: the whole batch, one update)."""
    if mini_batch_groups == 0:
        return 1
    if mini_batch_groups < 0 or batch_groups % mini_batch_groups:
        raise ValueError(
            f"train.ppo_mini_batch_groups={mini_batch_groups} must be 0 or divide rl.batch_groups={batch_groups}"
        )
    return batch_groups // mini_batch_groups


def with_proximal_logprobs(
    model_config: ModelConfig, step_config: StepConfig, params: Any, batch: TrainBatch, features: jax.Array | None
) -> TrainBatch:
    """`batch` with the logprobs of `params` (outside the gradient) as every micro-batch's
    ratio denominator."""
    frozen_params = jax.lax.stop_gradient(params)
    logprobs = jax.lax.map(
        lambda args: micro_batch_logprobs(model_config, step_config, frozen_params, *args)[0], (batch, features)
    )
    return batch.replace(proximal_logprobs=logprobs)


def with_reference_logprobs(
    model_config: ModelConfig,
    step_config: StepConfig,
    params: Any,
    reference: Any,
    batch: TrainBatch,
    features: jax.Array | None,
) -> TrainBatch:
    """`batch` with the reference policy's logprobs for the KL term of `loss.kl_coef` > 0
    (`reference`: its trainable groups; the frozen ones, and `features`, are `params'`);
    `batch` itself without the term."""
    if not step_config.loss.kl_coef:
        return batch
    if reference is None:
        raise ValueError(
            f"rl.kl_coef={step_config.loss.kl_coef} needs the reference policy's params (train_step's `reference`)"
        )
    ref_params = jax.lax.stop_gradient({**params, **reference})
    logprobs = jax.lax.map(
        lambda args: micro_batch_logprobs(model_config, step_config, ref_params, *args)[0], (batch, features)
    )
    return batch.replace(reference_logprobs=logprobs)


def mini_batches(tree: Any, count: int) -> Any:
    """Leading axis M of every leaf as [count, M / count]: the disjoint mini-batches."""

    def split(x: jax.Array) -> jax.Array:
        if x.shape[0] % count:
            raise ValueError(
                f"{x.shape[0]} micro-batches do not split into {count} mini-batches "
                f"(train.batching lays rows out for StepConfig.mini_batches)"
            )
        return x.reshape(count, x.shape[0] // count, *x.shape[1:])

    return jax.tree.map(split, tree)


def train_step(
    model_config: ModelConfig,
    step_config: StepConfig,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    batch: TrainBatch,
    reference: Any = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """`step_config.ppo_epochs` epochs of `step_config.mini_batches` optimizer updates each,
    one per disjoint mini-batch of `batch` (see `_update`); the step counter advances once.
    Loss and gradient norm are the mean over the first epoch's updates, its token count and
    entropy those of all its mini-batches (the first update: the policy that generated the
    batch); clip fraction, KL and ratios those of the last epoch (how far the updates moved
    it). `reference`: the trainable groups of the policy the KL term of `loss.kl_coef` > 0
    is measured against (the run's starting model); None without the term."""
    count = step_config.mini_batches
    features = frozen_vision_features(model_config, step_config, state.params, batch)
    if count > 1 and step_config.old_logprobs == "current":
        batch = with_proximal_logprobs(model_config, step_config, state.params, batch, features)
    batch = with_reference_logprobs(model_config, step_config, state.params, reference, batch, features)
    update = functools.partial(_update, model_config, step_config, optimizer)

    def epoch(params: Any, opt_state: Any) -> tuple[Any, Any, dict[str, Any]]:
        if count == 1:
            params, opt_state, measured = update(features, params, opt_state, batch)
            return params, opt_state, jax.tree.map(lambda x: x[None], measured)

        def one(carry, mini):
            params, opt_state = carry
            params, opt_state, measured = update(mini[1], params, opt_state, mini[0])
            return (params, opt_state), measured

        (params, opt_state), measured = jax.lax.scan(one, (params, opt_state), mini_batches((batch, features), count))
        return params, opt_state, measured

    params, opt_state, first = epoch(state.params, state.opt_state)
    non_finite = (~first["finite"]).sum(dtype=jnp.int32)
    last = first
    if step_config.ppo_epochs > 1:

        def again(_, carry):
            params, opt_state, _, non_finite = carry
            params, opt_state, measured = epoch(params, opt_state)
            return params, opt_state, measured, non_finite + (~measured["finite"]).sum(dtype=jnp.int32)

        params, opt_state, last, non_finite = jax.lax.fori_loop(
            1, step_config.ppo_epochs, again, (params, opt_state, first, non_finite)
        )
    denominator = first["denominator"].sum()
    has_tokens = denominator > 0
    new_state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        rng=jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)),
        skipped_updates=state.skipped_updates + non_finite,
    )
    first_metrics = combine_stacked_metrics(first["metrics"])
    summary, moved = summarize_metrics(first_metrics), summarize_metrics(combine_stacked_metrics(last["metrics"]))
    out = {
        "loss": first["loss"].mean(),
        "grad_norm": first["grad_norm"].mean(),
        "loss_tokens": first_metrics.token_count,
        "denominator": denominator,
        "updated": first["apply"].astype(jnp.float32).mean(),
        "nonfinite": (~first["finite"]).any().astype(jnp.float32),
        "skipped_updates": new_state.skipped_updates,
        "entropy": summary["entropy"],
        "trained_token_fraction": summary["trained_token_fraction"],
        "clip_fraction": moved["clip_fraction"],
        "approx_kl": moved["approx_kl"],
        "ref_kl": summary["ref_kl"],
        "is_ratio_max": jnp.where(has_tokens, moved["is_ratio_max"], 1.0),
        "is_ratio_mean": jnp.where(has_tokens, moved["is_ratio_mean"], 1.0),
    }
    return new_state, out


# ---------------------------------------------------------------------- jit


def make_train_step(
    model_config: ModelConfig,
    step_config: StepConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state_sharding: TrainState,
    donate: bool = True,
) -> Callable[..., tuple[TrainState, dict]]:
    """The jitted step `(state, batch, reference=None) -> (state, metrics)`; put batches with
    `train.batch_placement.shard_batch`; `reference` (see `train_step`) sharded like the params it copies.

    `donate` reuses the state's buffers for the new state; leave it off when something else
    (an engine generating concurrently) still reads the old params.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    step = on_mesh(mesh, functools.partial(train_step, model_config, step_config, optimizer))
    return jax.jit(step, out_shardings=(state_sharding, replicated), donate_argnums=(0,) if donate else ())


def on_mesh(mesh: Mesh, fn: Callable) -> Callable:
    """`fn` traced under `mesh`'s abstract mesh, so that the model's activation sharding
    constraints (models.sharding.shard_activation) resolve against it."""

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return traced
