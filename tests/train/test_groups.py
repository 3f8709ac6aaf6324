"""Pool arrays and rollout filters (docs/recipe.md, item 2) in both positions: the
released filters drop, after advantages, rollouts that showed no code-made image or whose
end reason is not DONE / EXCEED_MAX_TURNS / ERROR_IN_ACTION; a grading failure is broken."""

import dataclasses

import numpy as np
import pytest

from pyvision_jax.agent.trajectory import ContextImage, EndReason, GroupScores, TrajectoryGroup
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig
from pyvision_jax.train.groups import SelectionConfig, pool_arrays, select_rows
from tests.train.trajectories import make_trajectory

RELEASED = SelectionConfig(
    batch_groups=1, train_end_reasons=("DONE", "EXCEED_MAX_TURNS", "ERROR_IN_ACTION"), require_code_image=True
)
TASK = Task(id="t0", question="q", answer="a", answer_type="text", data_source="s", image_path="i.png")
CODE_IMAGE = ContextImage(1, "code", b"png", (1, 4, 4), 4)


def rollout(reason, code_image=True):
    base = make_trajectory(ModelConfig.preset("tiny"), seed=0, images=1)
    images = base.images + ((CODE_IMAGE,) if code_image else ())
    return dataclasses.replace(base, end_reason=reason, images=images)


def group(rollouts, rewards, grading_failed=()):
    n = len(rollouts)
    scores = GroupScores(tuple(rewards), tuple(r > 0 for r in rewards), (0,) * n, tuple(rewards), tuple(grading_failed))
    return TrajectoryGroup(TASK, tuple(rollouts), scores)


ROLLOUTS = [
    rollout(EndReason.DONE),
    rollout(EndReason.OVER_LENGTH),
    rollout(EndReason.DONE, code_image=False),
    rollout(EndReason.EXCEED_MAX_IMAGES),
    rollout(EndReason.ERROR_IN_ACTION),
    rollout(EndReason.EXCEED_MAX_TURNS),
]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_our_default_trains_every_usable_rollout_of_a_selected_group():
    pool = pool_arrays([group(ROLLOUTS, REWARDS)], 1, 6)
    selected = select_rows(pool, SelectionConfig(batch_groups=1))
    assert [r is not None for r in selected.rows] == [True] * 6 and selected.filtered == 0
    np.testing.assert_allclose(selected.advantages, np.asarray(REWARDS) - 1 / 3, atol=1e-6)


def test_released_filters_drop_after_advantages():
    pool = pool_arrays([group(ROLLOUTS, REWARDS)], 1, 6)
    selected = select_rows(pool, RELEASED)
    assert [r is not None for r in selected.rows] == [True, False, False, False, True, True]
    assert selected.filtered == 3
    # the mean still counts the dropped rollouts: the filters come after the advantages
    np.testing.assert_allclose(selected.advantages, [2 / 3, 0, 0, 0, -1 / 3, -1 / 3], atol=1e-6)


@pytest.mark.parametrize(
    "config, kept",
    [
        (SelectionConfig(batch_groups=1, require_code_image=True), [True, True, False, True, True, True]),
        (SelectionConfig(batch_groups=1, train_end_reasons=("DONE",)), [True, False, True, False, False, False]),
    ],
)
def test_each_filter_alone(config, kept):
    selected = select_rows(pool_arrays([group(ROLLOUTS, REWARDS)], 1, 6), config)
    assert [r is not None for r in selected.rows] == kept


def test_a_grading_failure_marks_the_rollout_broken():
    rollouts = [rollout(EndReason.DONE)] * 3
    pool = pool_arrays([group(rollouts, [1.0, 0.0, 0.0], grading_failed=(False, False, True))], 1, 3)
    np.testing.assert_array_equal(pool.broken[0], [False, False, True])
    selected = select_rows(pool, SelectionConfig(batch_groups=1))
    assert selected.rows[2] is None and selected.counts.broken_rollouts == 1
    np.testing.assert_allclose(selected.advantages, [0.5, -0.5, 0.0], atol=1e-6)
    released_stats = select_rows(pool, dataclasses.replace(RELEASED, stats_include_broken=True))
    np.testing.assert_allclose(released_stats.advantages, [2 / 3, -1 / 3, 0.0], atol=1e-6)


def test_group_scores_without_a_broken_field_read_as_not_broken():
    scores = GroupScores((1.0,), (True,), (0,), (1.0,))
    assert scores.broken == (False,)
    legacy = {k: v for k, v in scores.to_dict().items() if k != "broken"}
    assert GroupScores.from_dict(legacy) == scores
    with pytest.raises(ValueError, match="unequal lengths"):
        GroupScores((1.0,), (True,), (0,), (1.0,), (False, True))


def test_unknown_end_reasons_name_the_config_key():
    with pytest.raises(ValueError, match="rl.train_end_reasons"):
        SelectionConfig(train_end_reasons=("FINISHED",))


def test_negative_weight_reaches_the_selected_advantages():
    pool = pool_arrays([group(ROLLOUTS, REWARDS)], 1, 6)
    selected = select_rows(pool, SelectionConfig(batch_groups=1, negative_weight=0.25))
    expected = np.asarray(REWARDS) - 1 / 3
    np.testing.assert_allclose(selected.advantages, np.where(expected < 0, expected / 4, expected), atol=1e-6)
    with pytest.raises(ValueError, match="rl.negative_weight"):
        SelectionConfig(negative_weight=1.5)


# Filters before ranking (docs/recipe.md: rl.batch_unit), B = 2 groups of 4: group 0 loses two
# rollouts to the filters, group 1 all four, group 2 none, group 3 two.
FILTER_POOL = [
    (
        [
            rollout(EndReason.DONE),
            rollout(EndReason.OVER_LENGTH),
            rollout(EndReason.DONE),
            rollout(EndReason.EXCEED_MAX_IMAGES),
        ],
        [1.0, 0.0, 0.0, 0.0],
    ),
    ([rollout(EndReason.DONE, code_image=False) for _ in range(4)], [1.0, 0.0, 1.0, 0.0]),
    (
        [
            rollout(EndReason.DONE),
            rollout(EndReason.EXCEED_MAX_TURNS),
            rollout(EndReason.ERROR_IN_ACTION),
            rollout(EndReason.DONE),
        ],
        [1.0, 1.0, 0.0, 0.0],
    ),
    (
        [
            rollout(EndReason.DONE),
            rollout(EndReason.DONE),
            rollout(EndReason.OVER_LENGTH),
            rollout(EndReason.OVER_LENGTH),
        ],
        [1.0, 0.0, 0.0, 1.0],
    ),
]
FILTERS = dict(train_end_reasons=("DONE", "EXCEED_MAX_TURNS", "ERROR_IN_ACTION"), require_code_image=True)


def filter_pool():
    return pool_arrays([group(rollouts, rewards) for rollouts, rewards in FILTER_POOL], 4, 4)


def trained_rows(selected, pool):
    """(group, member) of each real row, from the trajectory objects."""
    where = {id(t): (p, g) for p, grp in enumerate(pool.groups) for g, t in enumerate(grp.trajectories)}
    return sorted(where[id(t)] for t in selected.rows if t is not None)


def test_the_released_positions_fill_the_batch_with_rollouts_that_train():
    pool = filter_pool()
    released = SelectionConfig(batch_groups=2, batch_unit="rollouts", stats_include_broken=True, **FILTERS)
    selected = select_rows(pool, released)
    assert len(selected.rows) == 8 and selected.full
    assert trained_rows(selected, pool) == [(0, 0), (0, 2), (2, 0), (2, 1), (2, 2), (2, 3), (3, 0), (3, 1)]
    # advantages of the whole group, before the filters: group 0 mean 1/4, group 3 mean 1/2
    by_row = dict(zip(map(id, selected.rows), selected.advantages))
    assert by_row[id(pool.groups[0].trajectories[0])] == pytest.approx(0.75)
    assert by_row[id(pool.groups[3].trajectories[1])] == pytest.approx(-0.5)
    trajectory_mode = select_rows(pool, dataclasses.replace(released, mode="trajectory", batch_unit="groups"))
    assert trained_rows(trajectory_mode, pool) == trained_rows(selected, pool) and trajectory_mode.full
    assert selected.counts.no_trainable == 1 and selected.filtered == 4


def test_our_positions_train_b_whole_groups():
    pool = filter_pool()
    ours = select_rows(pool, SelectionConfig(batch_groups=2))  # no filters: the two highest-std groups
    assert trained_rows(ours, pool) == [(1, g) for g in range(4)] + [(2, g) for g in range(4)] and ours.full
    filtered = select_rows(pool, SelectionConfig(batch_groups=2, **FILTERS))
    # group 1 kept nothing: the next group takes its slot; its dropped rollouts are masked rows
    assert trained_rows(filtered, pool) == [(2, g) for g in range(4)] + [(3, 0), (3, 1)]
    assert len(filtered.rows) == 8 and filtered.full and filtered.counts.trainable == 6
    with pytest.raises(ValueError, match="rl.batch_unit"):
        SelectionConfig(batch_unit="rows")


def test_a_pool_with_enough_trainable_rollouts_fills_the_batch_even_when_whole_groups_leave_a_row():
    pool = filter_pool()
    released = SelectionConfig(batch_groups=2, batch_unit="rollouts", **FILTERS)
    fewer = dataclasses.replace(released, train_end_reasons=("DONE",))  # groups 0, 2, 3 keep 2, 2, 2
    short = select_rows(pool, fewer)
    assert short.counts.trainable == 6 and short.counts.available == 6 and not short.full
    wide = select_rows(pool_arrays(pool.groups[2:] + pool.groups[:1], 3, 4), released)  # 4 + 2 + 2 rows
    assert wide.full and wide.counts.trainable == 8
    odd = [
        group([rollout(EndReason.DONE) for _ in range(4)], [1.0, 0.0, 1.0, 0.0]),
        group(
            [rollout(EndReason.DONE), rollout(EndReason.DONE), rollout(EndReason.DONE), rollout(EndReason.OVER_LENGTH)],
            [1.0, 0.0, 0.0, 1.0],
        ),
        group([rollout(EndReason.DONE) for _ in range(4)], [1.0, 1.0, 0.0, 0.0]),
    ]
    split = select_rows(pool_arrays(odd, 3, 4), released)  # 4 + 3 rows, then a group of 4 no longer fits
    assert split.counts.trainable == 7 and split.counts.available == 11 and split.full


def test_reward_controls_in_every_position():
    pools = [group(ROLLOUTS[:4], [1.0, 0.0, 1.0, 0.0]), group(ROLLOUTS[:4], [1.0, 1.0, 1.0, 1.0])]
    groups = [
        dataclasses.replace(
            g, trajectories=tuple(dataclasses.replace(t, rollout_index=4 * e + k) for k, t in enumerate(g.trajectories))
        )
        for e, g in enumerate(pools)
    ]
    pool = pool_arrays(groups, 2, 4)
    assert pool.group_seeds[0] != pool.group_seeds[1]
    recipe = select_rows(pool, SelectionConfig(batch_groups=1))
    np.testing.assert_allclose(recipe.advantages, [0.5, -0.5, 0.5, -0.5], atol=1e-6)
    entropy_min = select_rows(pool, SelectionConfig(batch_groups=1, reward_control="entropy_min"))
    assert [r is not None for r in entropy_min.rows] == [r is not None for r in recipe.rows]
    np.testing.assert_array_equal(entropy_min.advantages, np.zeros(4))
    random = [
        select_rows(pool, SelectionConfig(batch_groups=2, reward_control="random", control_seed=s)) for s in range(6)
    ]
    for selected in random:  # advantages are centred draws of {0, 1}: never the real ones of group 1 (all 0)
        kept = selected.advantages.reshape(2, 4)
        np.testing.assert_allclose(kept.sum(axis=1), 0.0, atol=1e-6)
    assert any(np.abs(s.advantages[4:]).sum() > 0 for s in random)  # the all-correct group gets draws
    assert (
        select_rows(pool, SelectionConfig(batch_groups=2, reward_control="random", control_seed=1)).advantages.tolist()
        == random[1].advantages.tolist()
    )
    with pytest.raises(ValueError, match="rl.reward_control"):
        SelectionConfig(reward_control="shuffle")
