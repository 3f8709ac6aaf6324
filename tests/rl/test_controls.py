"""Reward controls in every position: "" (the recipe) leaves rewards and advantages alone,
"random" replaces rewards with seeded Bernoulli(0.5) draws, "entropy_min" zeroes advantages."""

import jax
import numpy as np
import pytest

from pyvision_jax.rl.controls import controlled_advantages, controlled_rewards, random_rewards

REWARDS = np.array([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
VALID = np.array([[True] * 4, [True, True, True, False], [False] * 4])
SEEDS = np.array([11, 12, 0], np.uint32)


def test_the_recipe_position_changes_nothing():
    np.testing.assert_array_equal(controlled_rewards("", REWARDS, VALID, 0, SEEDS), REWARDS)
    advantages = np.array([0.5, -0.5, 0.25], np.float32)
    np.testing.assert_array_equal(controlled_advantages("", advantages), advantages)
    np.testing.assert_array_equal(controlled_advantages("random", advantages), advantages)


def test_entropy_min_zeroes_every_advantage_and_keeps_rewards():
    advantages = np.array([0.5, -0.5, 0.25], np.float32)
    np.testing.assert_array_equal(controlled_advantages("entropy_min", advantages), np.zeros(3))
    np.testing.assert_array_equal(controlled_rewards("entropy_min", REWARDS, VALID, 0, SEEDS), REWARDS)


def test_random_rewards_are_binary_on_valid_rollouts_and_ignore_the_real_ones():
    out = np.asarray(jax.jit(controlled_rewards, static_argnums=0)("random", REWARDS, VALID, 7, SEEDS))
    assert set(np.unique(out[VALID])) <= {0.0, 1.0}
    assert not out[~VALID].any()
    again = np.asarray(controlled_rewards("random", 1.0 - REWARDS, VALID, 7, SEEDS))
    np.testing.assert_array_equal(out, again)  # the real rewards do not enter


def test_random_rewards_are_fair_coins_per_group_seed():
    valid = np.ones((2000, 4), bool)
    seeds = np.arange(2000, dtype=np.uint32)
    draws = np.asarray(random_rewards(3, seeds, valid))
    assert draws.mean() == pytest.approx(0.5, abs=0.02)
    informative = (draws.std(axis=1) > 0).mean()  # P(not all equal) = 1 - 2 / 16
    assert informative == pytest.approx(7 / 8, abs=0.03)
    # the same group seed gives the same draws at any position in the pool; another run seed differs
    shuffled = np.asarray(random_rewards(3, seeds[::-1], valid))[::-1]
    np.testing.assert_array_equal(draws, shuffled)
    assert (np.asarray(random_rewards(4, seeds, valid)) != draws).mean() > 0.4


def test_an_unknown_control_is_refused():
    with pytest.raises(ValueError, match="rl.reward_control"):
        controlled_rewards("shuffle", REWARDS, VALID, 0, SEEDS)
