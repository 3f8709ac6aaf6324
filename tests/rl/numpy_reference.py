"""Plain, loop-based numpy references for the jitted RL kernels (float64, one item at a time)."""

from __future__ import annotations

import math

import numpy as np


def tool_reward(score, correct, num_tool_calls, valid, coef=0.1):
    out = np.zeros(np.shape(score))
    for p in range(out.shape[0]):
        for g in range(out.shape[1]):
            if valid[p, g]:
                out[p, g] = score[p, g] + (coef * num_tool_calls[p, g] if correct[p, g] else 0.0)
    return out


def group_stats(rewards, mask):
    """(count, mean, population std, unbiased std) per group."""
    rows = []
    for p in range(rewards.shape[0]):
        members = np.asarray(rewards[p], np.float64)[np.asarray(mask[p], bool)]
        n = len(members)
        mean = members.mean() if n else 0.0
        std = members.std() if n else 0.0
        unbiased = members.std(ddof=1) if n > 1 else 0.0
        rows.append((n, mean, std, unbiased))
    count, mean, std, unbiased = (np.array(column) for column in zip(*rows))
    return count, mean, std, unbiased


def group_outcomes(rewards, valid, broken, *, std_eps, min_members, drop_groups_with_broken):
    """Per group: 'padding', 'broken', 'too_few', 'zero_variance' or 'eligible'; and the stds."""
    usable = valid & ~broken
    count, _, std, unbiased = group_stats(rewards, usable)
    outcomes = []
    for p in range(rewards.shape[0]):
        if not valid[p].any():
            outcomes.append("padding")
        elif drop_groups_with_broken and (valid[p] & broken[p]).any():
            outcomes.append("broken")
        elif count[p] < min_members:
            outcomes.append("too_few")
        elif std[p] <= std_eps:
            outcomes.append("zero_variance")
        else:
            outcomes.append("eligible")
    return outcomes, std, unbiased


def select(
    rewards, valid, broken, num_select, *, mode="group", std_eps=1e-6, min_members=2, drop_groups_with_broken=False
):
    """Real selections only, best first: group ids (group mode) or flat rollout ids."""
    outcomes, std, unbiased = group_outcomes(
        rewards,
        valid,
        broken,
        std_eps=std_eps,
        min_members=min_members,
        drop_groups_with_broken=drop_groups_with_broken,
    )
    group_size = rewards.shape[1]
    if mode == "group":
        candidates = [(-std[p], p) for p in range(len(outcomes)) if outcomes[p] == "eligible"]
    else:
        candidates = [
            (-unbiased[p], p * group_size + g)
            for p in range(len(outcomes))
            if outcomes[p] == "eligible"
            for g in range(group_size)
            if valid[p, g] and not broken[p, g]
        ]
    return [index for _, index in sorted(candidates)[:num_select]], outcomes


def advantages(
    rewards, valid, broken, *, normalize_std=False, std_eps=1e-6, mean_over_full_group=False, negative_weight=1.0
):
    out = np.zeros(rewards.shape)
    for p in range(rewards.shape[0]):
        usable = [g for g in range(rewards.shape[1]) if valid[p, g] and not broken[p, g]]
        members = [g for g in range(rewards.shape[1]) if valid[p, g]] if mean_over_full_group else usable
        values = np.array([rewards[p, g] for g in members], np.float64)
        mean = values.mean() if len(values) else 0.0
        unbiased = values.std(ddof=1) if len(values) > 1 else 0.0
        for g in usable:
            out[p, g] = rewards[p, g] - mean
            if normalize_std:
                out[p, g] /= unbiased + std_eps
            if out[p, g] < 0:
                out[p, g] *= negative_weight
    return out


def ppo_token_loss(logprob, old, advantage, eps_low, eps_high, dual_clip):
    ratio = math.exp(logprob - old)
    loss = max(-advantage * ratio, -advantage * min(max(ratio, 1 - eps_low), 1 + eps_high))
    if dual_clip is not None and advantage < 0:
        loss = min(loss, -advantage * dual_clip)
    return loss


def ppo_loss(logprobs, old, advantages, mask, config, behaviour=None, ref=None, entropy=None):
    """(loss_sum, denominator, clipped token count) following PPOLossConfig's definitions."""
    batch, length = mask.shape
    advantages = np.asarray(advantages, np.float64)
    if advantages.ndim == 1:
        advantages = np.repeat(advantages[:, None], length, axis=1)
    sequence_sums, sequence_tokens, clipped_tokens = [], [], 0
    for b in range(batch):
        total, tokens = 0.0, 0
        sequence_is_log = (
            sum(old[b, t] - behaviour[b, t] for t in range(length) if mask[b, t]) if behaviour is not None else 0.0
        )
        for t in range(length):
            if not mask[b, t]:
                continue
            a = float(advantages[b, t])
            loss = ppo_token_loss(
                float(logprobs[b, t]), float(old[b, t]), a, config.eps_low, config.eps_high, config.dual_clip
            )
            ratio = math.exp(logprobs[b, t] - old[b, t])
            clipped_tokens += -a * min(max(ratio, 1 - config.eps_low), 1 + config.eps_high) > -a * ratio
            if entropy is not None and entropy[b, t] < config.min_entropy:
                loss = 0.0  # below the forking threshold: no policy-gradient term
            if config.importance_sampling == "token":
                loss *= min(math.exp(old[b, t] - behaviour[b, t]), config.is_truncation)
            elif config.importance_sampling == "sequence":
                loss *= min(math.exp(sequence_is_log), config.is_truncation)
            if config.kl_coef:
                log_ratio = ref[b, t] - logprobs[b, t]
                kl = {
                    "k1": -log_ratio,
                    "k2": 0.5 * log_ratio**2,
                    "k3": math.exp(log_ratio) - log_ratio - 1,
                }[config.kl_estimator]
                loss += config.kl_coef * kl
            if config.entropy_coef:
                loss -= config.entropy_coef * entropy[b, t]
            total += loss
            tokens += 1
        sequence_sums.append(total)
        sequence_tokens.append(tokens)
    if config.aggregation == "token-mean":
        return sum(sequence_sums), sum(sequence_tokens), clipped_tokens
    live = [b for b in range(batch) if sequence_tokens[b] > 0]
    if config.aggregation == "seq-mean-token-mean":
        return sum(sequence_sums[b] / sequence_tokens[b] for b in live), len(live), clipped_tokens
    norm = config.norm_length or length
    return sum(sequence_sums[b] / norm for b in live), len(live), clipped_tokens
