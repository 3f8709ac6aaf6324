import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvision_jax.rl import accumulative_tool_reward, group_statistics
from tests.rl import numpy_reference as ref

statistics = jax.jit(group_statistics)


reward = jax.jit(accumulative_tool_reward)

# The paper's worked examples, then partial credit (MRA) and a wrong answer with calls.
EXAMPLES = [(1.0, True, 3, 1.3), (0.0, False, 5, 0.0), (1.0, True, 0, 1.0), (0.7, True, 2, 0.9), (0.3, False, 4, 0.3)]


def test_paper_worked_examples():
    score, correct, calls = np.zeros((12, 6), np.float32), np.zeros((12, 6), bool), np.zeros((12, 6), np.int32)
    valid = np.zeros((12, 6), bool)
    for column, (s, c, n, _) in enumerate(EXAMPLES):
        score[0, column], correct[0, column], calls[0, column], valid[0, column] = s, c, n, True
    got = np.asarray(reward(score, correct, calls, valid, 0.1))
    np.testing.assert_allclose(got[0, : len(EXAMPLES)], [e[-1] for e in EXAMPLES], atol=1e-6)
    assert not got[0, len(EXAMPLES) :].any() and not got[1:].any()


def random_groups(seed, shape=(12, 6)):
    rng = np.random.default_rng(seed)
    score = rng.uniform(0, 1, shape).astype(np.float32)
    correct = rng.random(shape) < 0.5
    calls = rng.integers(0, 6, shape)
    valid = rng.random(shape) < 0.8
    return score, correct, calls, valid


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), coef=st.sampled_from([0.0, 0.1, 0.25]))
def test_reward_matches_reference_jitted_and_not(seed, coef):
    score, correct, calls, valid = random_groups(seed)
    expected = ref.tool_reward(score, correct, calls, valid, coef)
    eager = accumulative_tool_reward(score, correct, calls, valid, coef)
    jitted = reward(score, correct, calls, valid, coef)
    np.testing.assert_allclose(eager, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(eager, jitted)
    assert np.all(np.asarray(eager)[~valid] == 0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_group_statistics_match_reference(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(12, 6)).astype(np.float32)
    mask = rng.random((12, 6)) < 0.6
    mask[0] = False
    mask[1] = [True, False, False, False, False, False]
    count, mean, std, unbiased = ref.group_stats(rewards, mask)
    stats = statistics(rewards, mask)
    np.testing.assert_array_equal(stats.count, count)
    np.testing.assert_allclose(stats.mean, mean, atol=1e-5)
    np.testing.assert_allclose(stats.std, std, atol=1e-5)
    np.testing.assert_allclose(stats.unbiased_std, unbiased, atol=1e-5)


def test_group_statistics_ignore_masked_values():
    rewards = np.zeros((12, 6), np.float32)
    rewards[0, :4] = [1.0, 2.0, 3.0, 4.0]
    mask = np.zeros((12, 6), bool)
    mask[0, :2] = True
    garbage = rewards.copy()
    garbage[0, 2:] = [1e30, -7.0, np.inf, np.nan]
    first, second = statistics(rewards, mask), statistics(garbage, mask)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert float(first.mean[0]) == 1.5 and float(first.std[0]) == 0.5
    assert float(first.unbiased_std[0]) == pytest.approx(np.sqrt(0.5))
    assert int(first.count[0]) == 2 and not np.asarray(first.count)[1:].any()
