"""Token sampling: drawn frequencies follow the tempered, filtered softmax; tokens of probability
0 are never drawn, whatever the uniform; draws are deterministic per key; greedy is the argmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.rollout.sampling import SamplingArrays, inverse_cdf_tokens, sample_tokens, sampling_log_probs

DRAWS = 20_000
BELOW_ONE = np.nextafter(np.float32(1), np.float32(0))

sample = jax.jit(sample_tokens)


def draw_many(logits: np.ndarray, settings: SamplingArrays, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """DRAWS tokens (and logprobs) from the same logits [V], one key per row, in one call."""
    rows = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (DRAWS, logits.shape[-1]))
    tokens, logprobs = sample(rows, jax.random.split(jax.random.key(seed), DRAWS), settings)
    return np.asarray(tokens), np.asarray(logprobs)


def assert_frequencies(tokens: np.ndarray, probs: np.ndarray) -> None:
    """Each token's count is within 6 binomial standard deviations (plus 2) of DRAWS * p: a
    fair sampler fails this with probability below 1e-5 over 1000 bins; a shifted or
    untempered distribution misses by tens of deviations."""
    counts = np.bincount(tokens, minlength=probs.size)
    expected = DRAWS * probs
    bound = 6 * np.sqrt(expected * (1 - probs)) + 2
    worst = np.argmax(np.abs(counts - expected) - bound)
    assert np.all(np.abs(counts - expected) <= bound), (worst, counts[worst], expected[worst])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def varied_logits(vocab: int, seed: int) -> np.ndarray:
    """Logits whose neighbouring probabilities differ, with extra mass at block edges (token 0,
    511/512, 1023/1024 and the last), where an off-by-one would show."""
    logits = np.random.default_rng(seed).normal(size=vocab).astype(np.float32) * 1.5
    for edge in (0, 511, 512, 1023, 1024, vocab - 1):
        if edge < vocab:
            logits[edge] += 4.0 + (edge % 2)
    return logits


@pytest.mark.parametrize("vocab", [40, 1031])  # 1031 is prime: a ragged last block
def test_sampled_frequencies_match_tempered_softmax(vocab):
    logits = varied_logits(vocab, seed=vocab)
    tokens, logprobs = draw_many(logits, SamplingArrays.create(0.7, 0, 1.0))
    probs = softmax(logits / 0.7)
    assert_frequencies(tokens, probs)
    np.testing.assert_allclose(logprobs, np.log(probs[tokens]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 0.6), (8, 0.8)])
def test_filtered_tokens_are_never_drawn_and_kept_ones_follow_the_renormalised_softmax(top_k, top_p):
    logits = varied_logits(40, seed=1)
    settings = SamplingArrays.create(0.9, top_k, top_p)
    probs = np.exp(np.asarray(sampling_log_probs(logits[None], settings), np.float64))[0]
    kept = probs > 0
    assert 1 < kept.sum() <= (top_k or 40)
    tokens, _ = draw_many(logits, settings, seed=2)
    assert kept[tokens].all()
    assert_frequencies(tokens, probs / probs.sum())


def test_tokens_of_probability_zero_are_never_drawn_at_the_edges_of_the_uniform():
    with np.errstate(divide="ignore"):
        log_probs = np.log(np.array([[0.0, 0.25, 0.0, 0.25, 0.0, 0.5, 0.0]], np.float32))
    uniforms = np.array([0.0, 1e-30, 0.25, 0.5, 0.75, BELOW_ONE], np.float32)
    tokens = jax.jit(inverse_cdf_tokens)(np.repeat(log_probs, uniforms.size, 0), uniforms)
    # u * total on a cumulative boundary belongs to the next kept token
    assert np.asarray(tokens).tolist() == [1, 1, 3, 5, 5, 5]


@pytest.mark.parametrize("vocab", [7, 1000, 1031, 151936])
def test_sparse_rows_draw_only_kept_tokens_for_any_uniform(vocab):
    """Rows with a few kept tokens (at block edges and inside the ragged block's overlap, with
    tiny and unnormalised masses) draw a kept token for uniforms from 0 to just below 1."""
    rng = np.random.default_rng(vocab)
    uniforms = np.concatenate([[0.0, BELOW_ONE], rng.uniform(size=62)]).astype(np.float32)
    rows = np.full((uniforms.size, vocab), -np.inf, np.float32)
    for row in rows:
        kept = rng.choice(vocab, size=min(vocab, 4), replace=False)
        kept[0] = vocab - 1 - rng.integers(2)
        row[kept] = np.log(rng.uniform(1e-30, 0.3, size=kept.size))
    tokens = np.asarray(jax.jit(inverse_cdf_tokens)(rows, uniforms))
    assert np.isfinite(rows[np.arange(uniforms.size), tokens]).all()
    # the draw is the inverse of the row's cumulative distribution
    cumulative = np.cumsum(np.exp(rows.astype(np.float64)), axis=1)
    expected = [np.searchsorted(c, u * c[-1], side="right") for c, u in zip(cumulative, uniforms, strict=True)]
    assert tokens.tolist() == expected


def test_draws_are_deterministic_per_key_and_rows_independent():
    logits = jnp.asarray(np.stack([varied_logits(300, seed) for seed in range(6)]))
    keys = jax.random.split(jax.random.key(5), 6)
    settings = SamplingArrays.create(1.0, 0, 1.0)
    tokens, logprobs = sample(logits, keys, settings)
    again, _ = sample(logits, keys, settings)
    assert np.asarray(tokens).tolist() == np.asarray(again).tolist()
    order = np.array([3, 0, 5, 1, 4, 2])
    permuted, _ = sample(logits[order], keys[order], settings)
    assert np.asarray(permuted).tolist() == np.asarray(tokens)[order].tolist()
    other, _ = sample(logits, jax.random.split(jax.random.key(6), 6), settings)
    assert np.asarray(other).tolist() != np.asarray(tokens).tolist()
    expected = np.asarray(sampling_log_probs(logits, settings))[np.arange(6), np.asarray(tokens)]
    np.testing.assert_array_equal(logprobs, expected)


def test_greedy_takes_the_argmax_and_reports_the_untempered_logprob():
    logits = np.stack([varied_logits(300, seed) for seed in range(4)])
    logits[1, [7, 9]] = logits[1].max() + 1  # a tie: the first index
    keys = jax.random.split(jax.random.key(0), 4)
    tokens, logprobs = sample(logits, keys, SamplingArrays.create(0.0, 3, 0.5))
    assert np.asarray(tokens).tolist() == logits.argmax(-1).tolist() and int(tokens[1]) == 7
    expected = np.asarray(jax.nn.log_softmax(logits, -1))[np.arange(4), logits.argmax(-1)]
    np.testing.assert_allclose(logprobs, expected, rtol=1e-6)


def test_changing_the_settings_does_not_recompile():
    traces = []

    def traced(*args):
        traces.append(args)
        return sample_tokens(*args)

    compiled = jax.jit(traced)
    logits = jnp.asarray(np.stack([varied_logits(64, seed) for seed in range(2)]))
    keys = jax.random.split(jax.random.key(0), 2)
    for settings in [(1.0, 0, 1.0), (0.5, 4, 1.0), (0.0, 0, 1.0), (1.3, 0, 0.3)]:
        compiled(logits, keys, SamplingArrays.create(*settings))
    assert len(traces) == 1
