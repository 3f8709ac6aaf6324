"""Per-token PPO clipped surrogate over [B, T] token arrays, returned as (sum, denominator).

Every aggregation mode returns a sum and a denominator that do not mix micro-batches, so
gradient accumulation is exact: the full-batch loss is sum(loss_sum) / sum(denominator)
over micro-batches. Metrics are likewise sums/extrema that combine with `combine_metrics`.

"token-mean-per-micro-batch" is the released objective: each micro-batch's token mean
(sum = that mean, denominator = 1 when it has loss tokens), so the step's loss is the mean
of micro-batch means. It depends on how rows fall into micro-batches: rows of 1 and 99
tokens with A = +1 / -1 in micro-batches of one row give 0.0, where "token-mean" gives 0.98.
The released micro-batch is a few trajectories on one device; given `unit_tokens` and
`unit_share` (per sequence: the loss tokens of its unit, and 1 / the unit's sequences with
loss tokens; `train.batching` computes them for units of `rl.loss_micro_batch`
trajectories), each unit's token mean is one term wherever its sequences fall.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean-per-micro-batch"]
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean-per-micro-batch")
IS_LEVELS = ("none", "token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_LIMIT = 20.0


@dataclasses.dataclass(frozen=True)
class PPOLossConfig:
    """Settings of the PPO policy loss (the defaults are the PyVision-RL recipe)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = 3.0
    """Upper bound c on the loss ratio for negative advantages; None disables dual clip."""
    aggregation: Aggregation = "token-mean"
    norm_length: int | None = None
    """Constant token count for seq-mean-token-sum-norm; None uses the padded length T (then
    micro-batches must share T for exact accumulation)."""
    importance_sampling: Literal["none", "token", "sequence"] = "none"
    """Truncated IS correction between the rollout engine (behaviour) and the trainer's old
    logprobs (the proximal policy of decoupled PPO), per token or per sequence: the loss is
    weighted by min(exp(old - behaviour), is_truncation), summed over the sequence first
    at "sequence" level."""
    is_truncation: float = 2.0
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimate of KL(policy || reference) from d = ref - logprob on sampled tokens:
    k1 -d, k2 d^2 / 2, k3 exp(d) - d - 1. As losses their gradients per token are grad logprob,
    -d grad logprob and (1 - exp(d)) grad logprob: k2's is the on-policy gradient of the KL and
    grows linearly in d; k3's grows as exp(d), so one sampled token that the policy has made far
    less likely than the reference can dominate a step."""
    entropy_coef: float = 0.0
    min_entropy: float = 0.0
    """Policy-gradient terms only on tokens whose entropy (nats, under the current policy) is at
    least this: the "forking" tokens where sampled rollouts part ways (Wang et al. 2025, "Beyond
    the 80/20 rule"). Other tokens stay in the denominator and get no gradient. 0 trains all."""

    def __post_init__(self):
        problems = []
        if not 0 <= self.eps_low < 1:
            problems.append(f"eps_low={self.eps_low} must be in [0, 1)")
        if self.eps_high < 0:
            problems.append(f"eps_high={self.eps_high} must be >= 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            problems.append(f"dual_clip={self.dual_clip} must be > 1 or None")
        if self.aggregation not in AGGREGATIONS:
            problems.append(f"aggregation={self.aggregation!r} must be one of {AGGREGATIONS}")
        if self.norm_length is not None and self.norm_length < 1:
            problems.append(f"norm_length={self.norm_length} must be >= 1 or None")
        if self.importance_sampling not in IS_LEVELS:
            problems.append(f"importance_sampling={self.importance_sampling!r} must be one of {IS_LEVELS}")
        if self.is_truncation <= 0:
            problems.append(f"is_truncation={self.is_truncation} must be > 0")
        if not 0 <= self.kl_coef < float("inf"):
            problems.append(f"kl_coef={self.kl_coef} must be a finite number >= 0")
        if self.kl_estimator not in KL_ESTIMATORS:
            problems.append(f"kl_estimator={self.kl_estimator!r} must be one of {KL_ESTIMATORS}")
        if self.min_entropy < 0:
            problems.append(f"min_entropy={self.min_entropy} must be >= 0")
        if problems:
            raise ValueError("PPOLossConfig: " + "; ".join(problems))


class PPOMetrics(NamedTuple):
    """Accumulable metric sums over loss tokens; `summarize_metrics` turns them into values."""

    token_count: jax.Array
    clipped_tokens: jax.Array
    dual_clipped_tokens: jax.Array
    approx_kl_sum: jax.Array
    """Sum of the k3 estimate exp(old - new) - (old - new) - 1 of KL(new || old)."""
    entropy_sum: jax.Array
    trained_tokens: jax.Array
    """Loss tokens that carry a policy-gradient term (all of them unless `min_entropy` > 0)."""
    is_ratio_sum: jax.Array
    """Sum of the untruncated IS ratio exp(old - behaviour) (1 without behaviour logprobs)."""
    is_ratio_min: jax.Array
    is_ratio_max: jax.Array
    ref_kl_sum: jax.Array
    """Sum of the KL estimate to the reference policy (`kl_estimator`; 0 when `kl_coef` is 0)."""


class PPOLossOutput(NamedTuple):
    loss_sum: jax.Array
    denominator: jax.Array
    metrics: PPOMetrics


def _masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, values, 0.0).sum()


def ppo_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: PPOLossConfig = PPOLossConfig(),
    *,
    behaviour_logprobs: jax.Array | None = None,
    ref_logprobs: jax.Array | None = None,
    entropy: jax.Array | None = None,
    unit_tokens: jax.Array | None = None,
    unit_share: jax.Array | None = None,
) -> PPOLossOutput:
    """PPO clipped surrogate with asymmetric and dual clipping, per token, aggregated.

    Args:
      logprobs: [B, T] log-probabilities of the taken tokens under the current policy.
      old_logprobs: [B, T] the same under the policy of the trainer's previous step.
      advantages: [B] (one per sequence) or [B, T].
      loss_mask: [B, T], true only on model-generated tokens.
      config: static settings (hashable; pass with functools.partial or static_argnames).
      behaviour_logprobs: [B, T] from the rollout engine; needed for `importance_sampling`.
      ref_logprobs: [B, T] of the reference policy; needed when `kl_coef` > 0.
      entropy: [B, T] per-token policy entropy; needed when `entropy_coef` or `min_entropy` > 0,
        reported if given.
      unit_tokens, unit_share: [B] each, for "token-mean-per-micro-batch" over units of
        sequences (module docstring); other aggregations do not read them.

    Positions outside `loss_mask` never influence the result, whatever they hold.
    """
    mask = jnp.asarray(loss_mask, bool)
    batch, length = mask.shape
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = jnp.broadcast_to(advantages, (batch, length))
    advantages = jnp.where(mask, advantages, 0.0)

    log_ratio = jnp.where(mask, jnp.asarray(logprobs, jnp.float32) - jnp.asarray(old_logprobs, jnp.float32), 0.0)
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    token_loss = jnp.maximum(unclipped, clipped)
    dual_clipped = jnp.zeros_like(mask)
    if config.dual_clip is not None:
        dual_bound = -advantages * config.dual_clip
        dual_clipped = (advantages < 0) & (dual_bound < token_loss)
        token_loss = jnp.where(advantages < 0, jnp.minimum(token_loss, dual_bound), token_loss)

    trained = mask
    if config.min_entropy:
        if entropy is None:
            raise ValueError(f"ppo_loss: min_entropy={config.min_entropy} needs entropy")
        trained = mask & (jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32)) >= config.min_entropy)
        token_loss = jnp.where(trained, token_loss, 0.0)

    is_ratio = jnp.ones((batch, length), jnp.float32)
    if behaviour_logprobs is not None:
        is_log = jnp.where(
            mask, jnp.asarray(old_logprobs, jnp.float32) - jnp.asarray(behaviour_logprobs, jnp.float32), 0.0
        )
        if config.importance_sampling == "sequence":
            is_log = jnp.broadcast_to(is_log.sum(axis=-1, keepdims=True), (batch, length))
        is_log = jnp.clip(is_log, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        is_ratio = jnp.exp(is_log)
        if config.importance_sampling != "none":
            weight = jnp.exp(jnp.minimum(is_log, math.log(config.is_truncation)))
            token_loss = token_loss * jax.lax.stop_gradient(weight)
    elif config.importance_sampling != "none":
        raise ValueError(f"ppo_loss: importance_sampling={config.importance_sampling!r} needs behaviour_logprobs")

    ref_kl = jnp.zeros((batch, length), jnp.float32)
    if config.kl_coef:
        if ref_logprobs is None:
            raise ValueError(f"ppo_loss: kl_coef={config.kl_coef} needs ref_logprobs")
        ref_log_ratio = jnp.where(
            mask, jnp.asarray(ref_logprobs, jnp.float32) - jnp.asarray(logprobs, jnp.float32), 0.0
        )
        if config.kl_estimator == "k1":
            kl = -ref_log_ratio
        elif config.kl_estimator == "k2":
            kl = 0.5 * jnp.square(ref_log_ratio)
        else:
            clamped = jnp.clip(ref_log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
            kl = jnp.exp(clamped) - clamped - 1.0
        ref_kl = kl
        token_loss = token_loss + config.kl_coef * kl

    entropy_values = jnp.zeros((batch, length), jnp.float32)
    if entropy is not None:
        entropy_values = jnp.where(mask, jnp.asarray(entropy, jnp.float32), 0.0)
    if config.entropy_coef:
        if entropy is None:
            raise ValueError(f"ppo_loss: entropy_coef={config.entropy_coef} needs entropy")
        token_loss = token_loss - config.entropy_coef * entropy_values

    token_loss = jnp.where(mask, token_loss, 0.0)
    tokens_per_sequence = mask.sum(axis=-1)
    has_tokens = tokens_per_sequence > 0
    if config.aggregation == "token-mean":
        loss_sum = token_loss.sum()
        denominator = tokens_per_sequence.sum()
    elif config.aggregation == "token-mean-per-micro-batch" and unit_tokens is not None:
        unit_tokens = jnp.asarray(unit_tokens, jnp.float32)
        loss_sum = jnp.where(has_tokens, token_loss.sum(axis=-1) / jnp.maximum(unit_tokens, 1.0), 0.0).sum()
        denominator = jnp.where(has_tokens, jnp.asarray(unit_share, jnp.float32), 0.0).sum()
    elif config.aggregation == "token-mean-per-micro-batch":
        loss_sum = token_loss.sum() / jnp.maximum(tokens_per_sequence.sum(), 1)
        denominator = has_tokens.any()
    elif config.aggregation == "seq-mean-token-mean":
        per_sequence = token_loss.sum(axis=-1) / jnp.maximum(tokens_per_sequence, 1)
        loss_sum = jnp.where(has_tokens, per_sequence, 0.0).sum()
        denominator = has_tokens.sum()
    else:
        norm_length = config.norm_length if config.norm_length is not None else length
        loss_sum = token_loss.sum() / norm_length
        denominator = has_tokens.sum()

    neg_log_ratio = -log_ratio
    approx_kl = jnp.exp(neg_log_ratio) - neg_log_ratio - 1.0
    metrics = PPOMetrics(
        token_count=tokens_per_sequence.sum().astype(jnp.float32),
        clipped_tokens=_masked_sum((clipped > unclipped).astype(jnp.float32), mask),
        dual_clipped_tokens=_masked_sum(dual_clipped.astype(jnp.float32), mask),
        approx_kl_sum=_masked_sum(approx_kl, mask),
        entropy_sum=entropy_values.sum(),
        trained_tokens=trained.sum().astype(jnp.float32),
        is_ratio_sum=_masked_sum(is_ratio, mask),
        is_ratio_min=jnp.where(mask, is_ratio, jnp.inf).min(),
        is_ratio_max=jnp.where(mask, is_ratio, -jnp.inf).max(),
        ref_kl_sum=_masked_sum(jax.lax.stop_gradient(ref_kl), mask),
    )
    return PPOLossOutput(loss_sum=loss_sum, denominator=denominator.astype(jnp.float32), metrics=metrics)


def empty_metrics() -> PPOMetrics:
    """The metrics of no token: the identity of `combine_metrics`."""
    zero = jnp.zeros((), jnp.float32)
    sums = dict.fromkeys(PPOMetrics._fields, zero)
    return PPOMetrics(
        **{**sums, "is_ratio_min": jnp.array(jnp.inf, jnp.float32), "is_ratio_max": jnp.array(-jnp.inf, jnp.float32)}
    )


def combine_metrics(first: PPOMetrics, second: PPOMetrics) -> PPOMetrics:
    """Metrics of two micro-batches as if computed on their union."""
    return PPOMetrics(
        token_count=first.token_count + second.token_count,
        clipped_tokens=first.clipped_tokens + second.clipped_tokens,
        dual_clipped_tokens=first.dual_clipped_tokens + second.dual_clipped_tokens,
        approx_kl_sum=first.approx_kl_sum + second.approx_kl_sum,
        entropy_sum=first.entropy_sum + second.entropy_sum,
        trained_tokens=first.trained_tokens + second.trained_tokens,
        is_ratio_sum=first.is_ratio_sum + second.is_ratio_sum,
        is_ratio_min=jnp.minimum(first.is_ratio_min, second.is_ratio_min),
        is_ratio_max=jnp.maximum(first.is_ratio_max, second.is_ratio_max),
        ref_kl_sum=first.ref_kl_sum + second.ref_kl_sum,
    )


def combine_stacked_metrics(metrics: PPOMetrics) -> PPOMetrics:
    """Metrics stacked over a leading axis (one set per update) as one set: `combine_metrics`
    over the axis."""
    return PPOMetrics(
        *(
            x.min(0) if name == "is_ratio_min" else x.max(0) if name == "is_ratio_max" else x.sum(0)
            for name, x in zip(PPOMetrics._fields, metrics)
        )
    )


def summarize_metrics(metrics: PPOMetrics) -> dict[str, jax.Array]:
    """Means and extrema for logging: clip fractions, approx KL, entropy, IS ratio."""
    count = jnp.maximum(metrics.token_count, 1.0)
    return {
        "clip_fraction": metrics.clipped_tokens / count,
        "dual_clip_fraction": metrics.dual_clipped_tokens / count,
        "approx_kl": metrics.approx_kl_sum / count,
        "entropy": metrics.entropy_sum / count,
        "trained_token_fraction": metrics.trained_tokens / count,
        "is_ratio_mean": metrics.is_ratio_sum / count,
        "is_ratio_min": metrics.is_ratio_min,
        "is_ratio_max": metrics.is_ratio_max,
        "ref_kl": metrics.ref_kl_sum / count,
    }
