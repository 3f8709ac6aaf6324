"""The RL kernels' recipe switches in both positions, on the examples docs/recipe.md quotes:
loss aggregation per micro-batch and its loss units (item 5) and group statistics over
broken rollouts (item 10)."""

import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.rl import PPOLossConfig, group_advantages, ppo_loss, select_rollouts


def micro_batches_loss(aggregation, rows):
    """sum(loss_sum) / sum(denominator) over one-row micro-batches (what the train step
    computes), each row (tokens, advantage) at ratio 1."""
    config = PPOLossConfig(aggregation=aggregation)
    total, denominator = 0.0, 0.0
    for tokens, advantage in rows:
        mask = jnp.ones((1, max(tokens, 1)), bool) & (tokens > 0)
        zeros = jnp.zeros(mask.shape)
        out = ppo_loss(zeros, zeros, jnp.asarray([advantage]), mask, config)
        total, denominator = total + float(out.loss_sum), denominator + float(out.denominator)
    return total / max(denominator, 1.0)


@pytest.mark.parametrize("aggregation, expected", [("token-mean", 0.98), ("token-mean-per-micro-batch", 0.0)])
def test_rows_of_1_and_99_tokens_in_micro_batches_of_one(aggregation, expected):
    assert micro_batches_loss(aggregation, [(1, 1.0), (99, -1.0)]) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("unit_tokens, unit_share, expected", [([1, 99], [1, 1], 0.0), ([100, 100], [0.5, 0.5], 0.98)])
def test_loss_units_make_the_per_micro_batch_mean_independent_of_the_step_micro_batch(
    unit_tokens, unit_share, expected
):
    """Both rows in one step micro-batch: units of one row each give the released mean of
    one-row micro-batches, one unit of both rows the token mean."""
    mask = jnp.arange(99)[None, :] < jnp.asarray([[1], [99]])
    zeros = jnp.zeros(mask.shape)
    config = PPOLossConfig(aggregation="token-mean-per-micro-batch")
    out = ppo_loss(
        zeros,
        zeros,
        jnp.asarray([1.0, -1.0]),
        mask,
        config,
        unit_tokens=jnp.asarray(unit_tokens),
        unit_share=jnp.asarray(unit_share),
    )
    assert float(out.loss_sum) / float(out.denominator) == pytest.approx(expected, abs=1e-6)


def test_per_micro_batch_mean_ignores_empty_micro_batches_and_is_the_mean_of_means():
    rows = [(3, 1.0), (0, 5.0), (5, -0.5)]
    assert micro_batches_loss("token-mean-per-micro-batch", rows) == pytest.approx((-1.0 + 0.5) / 2)
    assert micro_batches_loss("token-mean", rows) == pytest.approx((-3.0 + 2.5) / 8)


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError, match="aggregation='per-row'"):
        PPOLossConfig(aggregation="per-row")


REWARDS = np.array(
    [
        [1.0, 0.0, 0.0, 0.0],  # the last rollout broke (reward 0)
        [1.0, 1.0, 1.0, 0.0],  # the last rollout broke
        [1.0, 0.0, 0.0, 0.0],
    ],
    np.float32,
)  # all but the first broke
BROKEN = np.array([[0, 0, 0, 1], [0, 0, 0, 1], [0, 1, 1, 1]], bool)
VALID = np.ones_like(BROKEN)


@pytest.mark.parametrize(
    "include, first_row", [(False, [2 / 3, -1 / 3, -1 / 3, 0.0]), (True, [0.75, -0.25, -0.25, 0.0])]
)
def test_the_advantage_mean_with_and_without_broken_rollouts(include, first_row):
    advantages = np.asarray(group_advantages(REWARDS, VALID, BROKEN, mean_over_full_group=include))
    np.testing.assert_allclose(advantages[0], first_row, atol=1e-6)
    assert (advantages[BROKEN] == 0).all()


def test_filter_statistics_and_min_members_with_and_without_broken_rollouts():
    ours = select_rollouts(REWARDS, VALID, BROKEN, 3, min_members=2)
    released = select_rollouts(REWARDS, VALID, BROKEN, 3, min_members=2, stats_include_broken=True)
    # ours: group 1 has zero variance over its usable rollouts, group 2 one usable member
    assert (int(ours.counts.zero_variance), int(ours.counts.too_few_members), int(ours.counts.eligible)) == (1, 1, 1)
    assert (
        int(released.counts.zero_variance),
        int(released.counts.too_few_members),
        int(released.counts.eligible),
    ) == (0, 0, 3)
    trains = np.asarray(released.rollout_real).reshape(3, 4)[np.argsort(np.asarray(released.indices))]
    np.testing.assert_array_equal(trains, ~BROKEN)  # broken rollouts never train either way
