import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pyvision_jax.rl import accumulative_tool_reward, group_statistics
from tests.rl import numpy_reference as ref


@pytest.mark.parametrize(
    "score, correct, calls, expected",
    [(1.0, True, 3, 1.3), (0.0, False, 5, 0.0), (1.0, True, 0, 1.0), (0.7, True, 2, 0.9), (0.3, False, 4, 0.3)],
)
def test_paper_worked_examples(score, correct, calls, expected):
    reward = accumulative_tool_reward(
        jnp.array([[score]]), jnp.array([[correct]]), jnp.array([[calls]]), jnp.array([[True]])
    )
    assert float(reward[0, 0]) == pytest.approx(expected, abs=1e-6)


def random_groups(seed, shape=(6, 5)):
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
    jitted = jax.jit(accumulative_tool_reward)(score, correct, calls, valid, coef)
    np.testing.assert_allclose(eager, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(eager, jitted)
    assert np.all(np.asarray(eager)[~valid] == 0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_group_statistics_match_reference(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(7, 6)).astype(np.float32)
    mask = rng.random((7, 6)) < 0.6
    mask[0] = False
    mask[1] = [True, False, False, False, False, False]
    count, mean, std, unbiased = ref.group_stats(rewards, mask)
    stats = jax.jit(group_statistics)(rewards, mask)
    np.testing.assert_array_equal(stats.count, count)
    np.testing.assert_allclose(stats.mean, mean, atol=1e-5)
    np.testing.assert_allclose(stats.std, std, atol=1e-5)
    np.testing.assert_allclose(stats.unbiased_std, unbiased, atol=1e-5)


def test_group_statistics_ignore_masked_values():
    rewards = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    mask = np.array([[True, True, False, False]])
    garbage = rewards.copy()
    garbage[0, 2:] = [1e30, -7.0]
    first, second = group_statistics(rewards, mask), group_statistics(garbage, mask)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert float(first.mean[0]) == 1.5 and float(first.std[0]) == 0.5
    assert float(first.unbiased_std[0]) == pytest.approx(np.sqrt(0.5))
