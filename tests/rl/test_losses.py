import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvision_jax.rl import PPOLossConfig, combine_metrics, ppo_loss, summarize_metrics
from tests.rl import numpy_reference as ref

B, T = 4, 10
loss_fn = jax.jit(ppo_loss, static_argnames="config")

CONFIGS = [
    PPOLossConfig(),
    PPOLossConfig(eps_low=0.1, eps_high=0.28, aggregation="seq-mean-token-mean"),
    PPOLossConfig(dual_clip=None, aggregation="seq-mean-token-sum-norm", norm_length=16),
    PPOLossConfig(importance_sampling="token", is_truncation=1.5, kl_coef=0.05, kl_estimator="k1"),
    PPOLossConfig(
        importance_sampling="sequence",
        kl_coef=0.1,
        kl_estimator="k3",
        entropy_coef=0.01,
        aggregation="seq-mean-token-mean",
    ),
    PPOLossConfig(min_entropy=1.0, kl_coef=0.05, entropy_coef=-0.1),
    PPOLossConfig(kl_coef=0.3, kl_estimator="k2"),
]


def random_tokens(seed, batch=B, length=T):
    rng = np.random.default_rng(seed)
    logprobs = (-rng.exponential(1.0, (batch, length))).astype(np.float32)
    old = (logprobs + rng.normal(0, 0.4, (batch, length))).astype(np.float32)
    behaviour = (old + rng.normal(0, 0.2, (batch, length))).astype(np.float32)
    reference = (logprobs + rng.normal(0, 0.3, (batch, length))).astype(np.float32)
    entropy = rng.uniform(0, 2, (batch, length)).astype(np.float32)
    advantages = rng.normal(0, 1, batch).astype(np.float32)
    lengths = rng.integers(0, length + 1, batch)
    mask = np.arange(length)[None, :] < lengths[:, None]
    mask[:, 0] &= rng.random(batch) < 0.5  # gaps, like tool-output tokens inside a trajectory
    return dict(
        logprobs=logprobs,
        old=old,
        behaviour=behaviour,
        reference=reference,
        entropy=entropy,
        advantages=advantages,
        mask=mask,
    )


def run(config, data, fn=loss_fn):
    return fn(
        data["logprobs"],
        data["old"],
        data["advantages"],
        data["mask"],
        config=config,
        behaviour_logprobs=data["behaviour"],
        ref_logprobs=data["reference"],
        entropy=data["entropy"],
    )


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), config_index=st.integers(0, len(CONFIGS) - 1))
def test_matches_reference(seed, config_index):
    config = CONFIGS[config_index]
    data = random_tokens(seed)
    out = run(config, data)
    loss_sum, denominator, clipped = ref.ppo_loss(
        data["logprobs"].astype(np.float64),
        data["old"].astype(np.float64),
        data["advantages"],
        data["mask"],
        config,
        behaviour=data["behaviour"].astype(np.float64),
        ref=data["reference"].astype(np.float64),
        entropy=data["entropy"],
    )
    np.testing.assert_allclose(out.loss_sum, loss_sum, rtol=1e-4, atol=1e-4)
    assert float(out.denominator) == denominator
    assert float(out.metrics.clipped_tokens) == clipped
    assert float(out.metrics.token_count) == data["mask"].sum()


def hand_written(logprobs, old, advantage, behaviour=None):
    """One sequence of hand-picked tokens placed in a [B, T] batch of padding (reuses compiles)."""
    length = len(logprobs)
    data = {key: np.zeros((B, T), np.float32) for key in ("logprobs", "old", "behaviour", "reference", "entropy")}
    data["logprobs"][0, :length] = logprobs
    data["reference"][0, :length] = logprobs
    data["old"][0, :length] = old
    data["behaviour"][0, :length] = old if behaviour is None else behaviour
    data["advantages"] = np.array([advantage, 0, 0, 0], np.float32)
    data["mask"] = np.zeros((B, T), bool)
    data["mask"][0, :length] = True
    return data


def test_clipping_and_dual_clip_by_hand():
    # ratios 1.65, 0.61, 5, 5 against eps 0.2 and dual clip 3
    logprobs = np.log(np.array([1.65, 0.61, 5.0, 5.0], np.float32))
    for advantage, expected in [(1.0, [-1.2, -0.61, -1.2, -1.2]), (-1.0, [1.65, 0.8, 3.0, 3.0])]:
        out = run(CONFIGS[0], hand_written(logprobs, 0.0, advantage))
        assert float(out.loss_sum) == pytest.approx(sum(expected), rel=1e-5)
        assert float(out.denominator) == 4
    no_dual = run(CONFIGS[2], hand_written(logprobs, 0.0, -1.0))  # token sum / norm_length 16
    assert float(no_dual.loss_sum) == pytest.approx((1.65 + 0.8 + 5 + 5) / 16, rel=1e-5)
    assert float(no_dual.denominator) == 1
    asymmetric = run(CONFIGS[1], hand_written(logprobs, 0.0, 1.0))  # eps 0.1 / 0.28, sequence mean
    assert float(asymmetric.loss_sum) == pytest.approx(-(1.28 + 0.61 + 1.28 + 1.28) / 4, rel=1e-5)
    assert float(asymmetric.metrics.clipped_tokens) == 3


def test_importance_sampling_truncation_and_metrics():
    behaviour = np.log(np.array([0.25, 1.0, 4.0], np.float32))  # IS ratios old/behaviour 4, 1, 0.25
    data = hand_written(np.zeros(3), np.zeros(3), 1.0, behaviour)
    token_level = run(CONFIGS[3], data)  # truncation at 1.5; the KL to an identical reference is 0
    assert float(token_level.loss_sum) == pytest.approx(-(1.5 + 1.0 + 0.25), rel=1e-5)
    summary = summarize_metrics(token_level.metrics)
    assert float(summary["is_ratio_min"]) == pytest.approx(0.25, rel=1e-5)
    assert float(summary["is_ratio_max"]) == pytest.approx(4.0, rel=1e-5)
    assert float(summary["is_ratio_mean"]) == pytest.approx(5.25 / 3, rel=1e-5)
    sequence_level = run(CONFIGS[4], data)  # product of ratios is 1; sequence mean of -1 per token
    assert float(sequence_level.loss_sum) == pytest.approx(-1.0, rel=1e-5)
    assert float(summarize_metrics(sequence_level.metrics)["is_ratio_max"]) == pytest.approx(1.0, rel=1e-5)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), config_index=st.sampled_from([2, 4]))
def test_micro_batch_accumulation_equals_full_batch(seed, config_index):
    config = CONFIGS[config_index]
    data = random_tokens(seed, batch=8)
    full = run(config, data)
    halves = [run(config, {k: v[:4] for k, v in data.items()}), run(config, {k: v[4:] for k, v in data.items()})]
    np.testing.assert_allclose(halves[0].loss_sum + halves[1].loss_sum, full.loss_sum, rtol=1e-5, atol=1e-5)
    assert float(halves[0].denominator + halves[1].denominator) == float(full.denominator)
    combined = summarize_metrics(combine_metrics(halves[0].metrics, halves[1].metrics))
    for name, value in summarize_metrics(full.metrics).items():
        np.testing.assert_allclose(combined[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def loss_sum_of_logprobs(logprobs, old, advantages, mask, behaviour, reference, entropy, config):
    return ppo_loss(
        logprobs, old, advantages, mask, config, behaviour_logprobs=behaviour, ref_logprobs=reference, entropy=entropy
    ).loss_sum


loss_grad = jax.jit(jax.grad(loss_sum_of_logprobs), static_argnames="config")
GRAD_KEYS = ("logprobs", "old", "advantages", "mask", "behaviour", "reference", "entropy")


def test_accumulated_gradient_equals_full_batch_gradient():
    config = CONFIGS[4]
    data = random_tokens(11, batch=8)
    full_grad = loss_grad(*(data[k] for k in GRAD_KEYS), config=config)
    micro_grads = [loss_grad(*(data[k][part] for k in GRAD_KEYS), config=config) for part in (slice(0, 4), slice(4, 8))]
    np.testing.assert_allclose(np.concatenate(micro_grads), full_grad, rtol=1e-5, atol=1e-7)


def pad_tokens(data, seed):
    """The batch with 2 more sequences and 5 more positions, all masked out and full of garbage."""
    rng = np.random.default_rng(seed)
    padded = {}
    for key, value in data.items():
        if key == "advantages":
            padded[key] = np.concatenate([value, rng.normal(0, 5, 2).astype(np.float32)])
        elif key == "mask":
            padded[key] = np.zeros((B + 2, T + 5), bool)
            padded[key][:B, :T] = value
        else:
            garbage = rng.choice([-1e30, 40.0, -80.0, np.nan], size=(B + 2, T + 5)).astype(np.float32)
            garbage[:B, :T] = value
            padded[key] = garbage
    return padded


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), config_index=st.sampled_from([2, 4]))
def test_padding_never_changes_the_loss(seed, config_index):
    config = CONFIGS[config_index]  # seq-mean-token-sum-norm needs a fixed norm_length to be padding-proof
    data = random_tokens(seed)
    plain, wide = run(config, data), run(config, pad_tokens(data, seed))
    np.testing.assert_allclose(wide.loss_sum, plain.loss_sum, rtol=1e-6, atol=1e-6)
    assert float(wide.denominator) == float(plain.denominator)
    for name, value in summarize_metrics(plain.metrics).items():
        np.testing.assert_allclose(summarize_metrics(wide.metrics)[name], value, rtol=1e-6, err_msg=name)


def test_padding_gets_no_gradient():
    padded = pad_tokens(random_tokens(2), 2)
    grad = np.asarray(loss_grad(*(padded[k] for k in GRAD_KEYS), config=CONFIGS[4]))
    assert np.isfinite(grad).all()
    assert not grad[~padded["mask"]].any() and grad[padded["mask"]].any()


def test_jit_equals_eager():
    data = random_tokens(5)
    eager, jitted = run(CONFIGS[4], data, fn=ppo_loss), run(CONFIGS[4], data)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_min_entropy_trains_only_the_forking_tokens():
    """Tokens below the entropy threshold get no policy gradient but stay in the denominator."""
    data = random_tokens(1)
    config = PPOLossConfig(min_entropy=1.0)
    forking = data["mask"] & (data["entropy"] >= 1.0)
    assert forking.any() and (data["mask"] & ~forking).any()
    grad = np.asarray(loss_grad(*(data[k] for k in GRAD_KEYS), config=config))
    assert not grad[~forking].any() and grad[forking].any()
    out, everything = run(config, data), run(PPOLossConfig(), data)
    assert float(out.metrics.trained_tokens) == forking.sum()
    assert float(everything.metrics.trained_tokens) == data["mask"].sum()
    assert float(out.denominator) == float(everything.denominator) == data["mask"].sum()
    fraction = summarize_metrics(out.metrics)["trained_token_fraction"]
    np.testing.assert_allclose(fraction, forking.sum() / data["mask"].sum(), rtol=1e-6)
    with pytest.raises(ValueError, match="min_entropy=1.0 needs entropy"):
        ppo_loss(data["logprobs"], data["old"], data["advantages"], data["mask"], config)
    with pytest.raises(ValueError, match="min_entropy=-1"):
        PPOLossConfig(min_entropy=-1)


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="aggregation='token-sum'"):
        PPOLossConfig(aggregation="token-sum")
    with pytest.raises(ValueError, match="dual_clip=0.5"):
        PPOLossConfig(dual_clip=0.5)
    data = random_tokens(0)
    with pytest.raises(ValueError, match="needs behaviour_logprobs"):
        ppo_loss(
            data["logprobs"], data["old"], data["advantages"], data["mask"], PPOLossConfig(importance_sampling="token")
        )
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        ppo_loss(data["logprobs"], data["old"], data["advantages"], data["mask"], PPOLossConfig(kl_coef=0.1))


@pytest.mark.parametrize(
    "estimator, per_token",
    [
        ("k1", lambda d: np.ones_like(d)),
        ("k2", lambda d: -d),
        ("k3", lambda d: 1.0 - np.exp(d)),
    ],
)
def test_the_kl_terms_gradient_per_token_follows_its_estimator(estimator, per_token):
    logprobs = np.log(np.array([[0.9, 0.5, 0.01, 0.2]], np.float32))
    reference = np.log(np.array([[0.9, 0.6, 0.5, 0.1]], np.float32))
    mask = np.array([[True, True, True, False]])
    config = PPOLossConfig(kl_coef=0.3, kl_estimator=estimator)

    def kl_sum(lp):
        return ppo_loss(lp, lp, np.zeros(1, np.float32), mask, config, ref_logprobs=reference).loss_sum

    grad = np.asarray(jax.grad(kl_sum)(logprobs))
    expected = np.where(mask, 0.3 * per_token(reference - logprobs), 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    if estimator == "k3":  # the token the policy made 50 x less likely than the reference dominates
        assert abs(grad[0, 2]) > 40 * abs(grad[0, :2]).max()
    if estimator == "k2":
        assert abs(grad[0, 2]) < 1.2
