"""The jitted, sharded SFT step: next-token cross-entropy on assistant tokens only.

A micro-batch contributes `(sum of -logprob over its loss tokens, their count)`; the step
scans the micro-batches adding both, and divides once, so the loss is the token mean over
the whole batch however it is split into micro-batches or padded. Logprobs come from the
same chunked function the GRPO step uses (`train.step.micro_batch_logprobs`); batches are
the GRPO `TrainBatch` (advantages and behaviour logprobs unused).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pyvision_jax.models import ModelConfig
from pyvision_jax.train.state import TrainState, split_trainable
from pyvision_jax.train.step import StepConfig, TrainBatch, micro_batch_logprobs


def micro_batch_nll(
    model_config: ModelConfig, step_config: StepConfig, trainable: Any, frozen: Any, micro: TrainBatch
) -> tuple[jax.Array, jax.Array]:
    """(sum of -logprob over the loss tokens, their count) of one micro-batch."""
    logprobs, _ = micro_batch_logprobs(model_config, step_config, {**trainable, **frozen}, micro)
    mask = micro.loss_mask & micro.attention_mask
    return -jnp.sum(jnp.where(mask, logprobs, 0.0)), jnp.sum(mask).astype(jnp.float32)


def sft_loss_and_grads(
    model_config: ModelConfig, step_config: StepConfig, params: Any, batch: TrainBatch
) -> tuple[jax.Array, Any, jax.Array]:
    """(token-mean loss, its gradient w.r.t. the trainable groups, loss token count)."""
    trainable, frozen = split_trainable(params, step_config.frozen_prefixes)
    grad_fn = jax.value_and_grad(functools.partial(micro_batch_nll, model_config, step_config), has_aux=True)

    def body(carry, micro):
        grads, total, count = carry
        (mb_sum, mb_count), mb_grads = grad_fn(trainable, frozen, micro)
        return (jax.tree.map(jnp.add, grads, mb_grads), total + mb_sum, count + mb_count), None

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    (grads, total, count), _ = jax.lax.scan(body, init, batch)
    scale = 1.0 / jnp.maximum(count, 1.0)
    grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, trainable)
    return total * scale, grads, count


def sft_train_step(
    model_config: ModelConfig,
    step_config: StepConfig,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    batch: TrainBatch,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update; skipped (state kept, counter advanced) when the loss or the
    gradient is not finite or the batch has no loss token."""
    loss, grads, count = sft_loss_and_grads(model_config, step_config, state.params, batch)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    apply = finite & (count > 0)
    trainable, frozen = split_trainable(state.params, step_config.frozen_prefixes)
    updates, new_opt_state = optimizer.update(
        jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads), state.opt_state, trainable
    )
    new_trainable = optax.apply_updates(trainable, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)  # noqa: E731
    params = {**keep(new_trainable, trainable), **frozen}
    new_state = state.replace(
        step=state.step + 1,
        params={k: params[k] for k in state.params},
        opt_state=keep(new_opt_state, state.opt_state),
        skipped_updates=state.skipped_updates + (~finite).astype(jnp.int32),
    )
    return new_state, {"loss": loss, "grad_norm": grad_norm, "loss_tokens": count, "updated": apply.astype(jnp.float32)}


def make_sft_step(
    model_config: ModelConfig,
    step_config: StepConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state_sharding: TrainState,
) -> Callable[[TrainState, TrainBatch], tuple[TrainState, dict]]:
    """The jitted step `(state, batch) -> (state, metrics)`; put batches with
    `train.batch_placement.shard_batch`."""
    step = functools.partial(sft_train_step, model_config, step_config, optimizer)
    return jax.jit(step, out_shardings=(state_sharding, NamedSharding(mesh, PartitionSpec())), donate_argnums=(0,))
