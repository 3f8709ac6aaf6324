import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvision_jax.rl import select_rollouts, take_selected
from tests.rl import numpy_reference as ref

P, G = 12, 6


def random_batch(seed, broken_rate=0.1):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([0.0, 1.0, 1.1, 1.3, 0.45], size=(P, G)).astype(np.float32)
    constant = rng.random(P) < 0.3
    rewards[constant] = rewards[constant, :1]
    valid = rng.random((P, G)) < 0.9
    valid[rng.random(P) < 0.15] = False
    broken = (rng.random((P, G)) < broken_rate) & valid
    return rewards, valid, broken


@functools.lru_cache(maxsize=None)
def jitted_select(num_select, mode, min_members, drop_groups_with_broken):
    return jax.jit(
        functools.partial(
            select_rollouts,
            num_select=num_select,
            mode=mode,
            min_members=min_members,
            drop_groups_with_broken=drop_groups_with_broken,
        )
    )


def assert_matches_reference(selection, expected, rank_values):
    """Same number of real entries, real ones first, unique, and the same ranking values.

    Values that tie only up to float rounding may be ordered either way, so indices are
    compared exactly only where the reference's values are separated.
    """
    real = np.asarray(selection.real)
    indices = np.asarray(selection.indices)
    assert real.sum() == len(expected)
    assert real[: len(expected)].all() and not real[len(expected) :].any()
    chosen = indices[: len(expected)]
    assert len(set(chosen.tolist())) == len(chosen)
    np.testing.assert_allclose(rank_values[chosen], rank_values[expected], atol=1e-5)
    separated = np.isclose(rank_values[expected][:, None], rank_values[None, :], atol=1e-5).sum(axis=1) == 1
    np.testing.assert_array_equal(chosen[separated], np.asarray(expected, int)[separated])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), policy=st.sampled_from([(2, False), (1, True), (4, False)]))
def test_group_mode_matches_reference(seed, policy):
    min_members, drop_groups_with_broken = policy
    rewards, valid, broken = random_batch(seed)
    selection = jitted_select(P, "group", min_members, drop_groups_with_broken)(rewards, valid, broken)
    expected, outcomes = ref.select(
        rewards, valid, broken, P, min_members=min_members, drop_groups_with_broken=drop_groups_with_broken
    )
    _, std, _ = ref.group_outcomes(
        rewards, valid, broken, std_eps=1e-6, min_members=min_members, drop_groups_with_broken=drop_groups_with_broken
    )
    assert_matches_reference(selection, expected, std)
    counts = selection.counts
    assert int(counts.groups) == sum(o != "padding" for o in outcomes)
    assert int(counts.zero_variance) == outcomes.count("zero_variance")
    assert int(counts.too_few_members) == outcomes.count("too_few")
    assert int(counts.broken_groups_dropped) == outcomes.count("broken")
    assert int(counts.eligible) == outcomes.count("eligible")
    assert int(counts.kept) == len(expected)
    assert int(counts.broken_rollouts) == int((valid & broken).sum())
    assert (
        counts.zero_variance
        + counts.too_few_members
        + counts.broken_groups_dropped
        + counts.no_trainable
        + counts.eligible
    ) == counts.groups
    for index in np.asarray(selection.indices)[np.asarray(selection.real)]:
        assert outcomes[index] == "eligible" and std[index] > 1e-6


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_select=st.sampled_from([40]))
def test_trajectory_mode_matches_reference(seed, num_select):
    rewards, valid, broken = random_batch(seed)
    selection = jitted_select(num_select, "trajectory", 2, False)(rewards, valid, broken)
    expected, _ = ref.select(rewards, valid, broken, num_select, mode="trajectory")
    _, _, unbiased = ref.group_outcomes(
        rewards, valid, broken, std_eps=1e-6, min_members=2, drop_groups_with_broken=False
    )
    assert_matches_reference(selection, expected, np.repeat(unbiased, G))
    np.testing.assert_array_equal(selection.rollout_indices, selection.indices)
    chosen = np.asarray(selection.indices)[np.asarray(selection.real)]
    assert not broken.reshape(-1)[chosen].any() and valid.reshape(-1)[chosen].all()


def test_smaller_num_select_keeps_the_best_prefix():
    rewards, valid, broken = random_batch(3, broken_rate=0.0)
    rewards = np.round(rewards * 4) / 4  # dyadic rewards: stds are exact, ties are true ties
    full = jitted_select(P, "group", 2, False)(rewards, valid, broken)
    top = jitted_select(3, "group", 2, False)(rewards, valid, broken)
    np.testing.assert_array_equal(top.indices, np.asarray(full.indices)[:3])
    np.testing.assert_array_equal(top.real, np.asarray(full.real)[:3])


def padded_batch(rewards, valid=None, broken=None):
    """Hand-written groups placed in a [P, G] batch whose other entries are padding."""
    rewards = np.asarray(rewards, np.float32)
    valid = np.ones(rewards.shape, bool) if valid is None else np.asarray(valid, bool)
    broken = np.zeros(rewards.shape, bool) if broken is None else np.asarray(broken, bool)
    out = np.full((P, G), 7.0, np.float32), np.zeros((P, G), bool), np.zeros((P, G), bool)
    for target, source in zip(out, (rewards, valid, broken)):
        target[: source.shape[0], : source.shape[1]] = source
    return out


def test_ranking_by_std_with_ties_to_lower_index():
    batch = padded_batch(
        [
            [1, 1, 1, 1],  # zero variance
            [1, 0, 0, 0],  # std sqrt(3)/4
            [1, 1, 0, 0],  # std 1/2
            [0, 0, 0, 1],  # ties group 1
            [0, 1, 0, 1],  # ties group 2
            [0, 0, 0, 0],  # zero variance
        ]
    )
    selection = jitted_select(P, "group", 2, False)(*batch)
    np.testing.assert_array_equal(selection.indices[:4], [2, 4, 1, 3])
    np.testing.assert_array_equal(np.flatnonzero(selection.real), [0, 1, 2, 3])
    assert int(selection.counts.zero_variance) == 2 and int(selection.counts.kept) == 4
    assert int(selection.counts.groups) == 6
    assert selection.rollout_indices.shape == (P * G,)
    np.testing.assert_array_equal(selection.rollout_indices[:G], np.arange(2 * G, 3 * G))
    np.testing.assert_array_equal(selection.rollout_real[:G], [True] * 4 + [False] * (G - 4))
    assert not np.asarray(selection.rollout_real)[4 * G :].any()


@pytest.mark.parametrize("mode, num_select", [("group", 1), ("trajectory", 4)])
def test_arrival_order_takes_the_first_informative_group_not_the_highest_std(mode, num_select):
    batch = padded_batch(
        [
            [1, 1, 1, 1],  # zero variance
            [1, 0, 0, 0],  # informative, arrived first
            [1, 1, 0, 0],  # the highest std
            [0, 0, 0, 1],
        ]
    )
    groups = lambda s: {int(i) // G for i, r in zip(s.rollout_indices, s.rollout_real) if r}
    assert groups(select_rollouts(*batch, num_select, mode=mode)) == {2}
    assert groups(select_rollouts(*batch, num_select, mode=mode, rank_by="arrival")) == {1}
    with pytest.raises(ValueError, match="rank_by must be"):
        select_rollouts(*batch, num_select, mode=mode, rank_by="random")


def test_trajectory_mode_ranks_by_unbiased_std_and_may_split_groups():
    broken = np.zeros((3, 4), bool)
    broken[1, 3] = True  # group 1 usable [1, 1, 0]: unbiased std 0.577 > group 0's 0.5
    batch = padded_batch([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], broken=broken)
    selection = jitted_select(40, "trajectory", 2, False)(*batch)
    np.testing.assert_array_equal(selection.indices[:5], [G, G + 1, G + 2, 0, 1])
    np.testing.assert_array_equal(np.flatnonzero(selection.real), np.arange(7))
    np.testing.assert_array_equal(selection.rollout_indices, selection.indices)


def test_broken_policy_and_min_members():
    rewards = [[1, 0, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    valid = np.ones((3, 6), bool)
    valid[2, 3:] = False
    broken = np.zeros((3, 6), bool)
    broken[0, 0] = True
    batch = padded_batch(rewards, valid, broken)  # usable stds: 0.49, 0.37, 0.47 (3 members)

    def kept(selection):
        return np.asarray(selection.indices)[np.asarray(selection.real)].tolist()

    keep = jitted_select(P, "group", 2, False)(*batch)
    assert kept(keep) == [0, 2, 1]
    assert int(keep.counts.broken_rollouts) == 1
    assert not np.asarray(keep.rollout_real)[0]  # the broken rollout of a kept group never trains
    drop = jitted_select(P, "group", 1, True)(*batch)
    assert kept(drop) == [2, 1] and int(drop.counts.broken_groups_dropped) == 1
    strict = jitted_select(P, "group", 4, False)(*batch)
    assert kept(strict) == [0, 1] and int(strict.counts.too_few_members) == 1


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_padding_never_changes_selection(seed):
    rewards, valid, broken = random_batch(seed)
    rng = np.random.default_rng(seed + 1)
    padded_rewards = rng.normal(size=(P + 4, G + 2)).astype(np.float32) * 100
    padded_rewards[:P, :G] = rewards
    padded_valid = np.zeros((P + 4, G + 2), bool)
    padded_valid[:P, :G] = valid
    padded_broken = rng.random((P + 4, G + 2)) < 0.5
    padded_broken[:P, :G] = broken
    plain = jitted_select(P, "group", 2, False)(rewards, valid, broken)
    padded = jitted_select(P, "group", 2, False)(padded_rewards, padded_valid, padded_broken)
    _, std, _ = ref.group_outcomes(rewards, valid, broken, std_eps=1e-6, min_members=2, drop_groups_with_broken=False)
    plain_choice = np.asarray(plain.indices)[np.asarray(plain.real)]
    assert_matches_reference(padded, plain_choice, np.concatenate([std, np.zeros(4)]))
    for name in ("groups", "zero_variance", "too_few_members", "eligible", "kept"):
        assert int(getattr(plain.counts, name)) == int(getattr(padded.counts, name))


def test_jit_equals_eager_and_take_selected():
    rewards, valid, broken = random_batch(7)
    eager = select_rollouts(rewards, valid, broken, P)
    jitted = jitted_select(P, "group", 2, False)(rewards, valid, broken)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(a, b)
    gathered = take_selected(rewards, eager)
    np.testing.assert_array_equal(gathered, rewards[np.asarray(eager.indices)].reshape(-1))
    extra = np.arange(P * G * 3).reshape(P, G, 3)
    assert take_selected(extra, eager).shape == (P * G, 3)


def test_bad_arguments_raise_clear_errors():
    rewards, valid, broken = random_batch(0)
    with pytest.raises(ValueError, match="num_select=13"):
        select_rollouts(rewards, valid, broken, P + 1)
    with pytest.raises(ValueError, match="mode must be"):
        select_rollouts(rewards, valid, broken, 2, mode="groups")


# Rollout filters before ranking (docs/recipe.md, rl.batch_unit): four groups of 4, B = 2.
FILTER_REWARDS = [
    [1, 0, 1, 0],  # two of its rollouts filtered: 2 trainable, std 0.5
    [1, 0, 1, 0],  # every rollout filtered: none trainable, std 0.5
    [1, 1, 0, 0],  # all trainable, std 0.5
    [1, 0, 0, 0],
]  # two filtered: 2 trainable, std 0.43
FILTER_KEEP = [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]


def filter_batch():
    rewards = np.asarray(FILTER_REWARDS, np.float32)
    return rewards, np.ones((4, 4), bool), np.zeros((4, 4), bool), np.asarray(FILTER_KEEP, bool)


def trained(selection):
    return sorted(int(i) for i, r in zip(selection.rollout_indices, selection.rollout_real) if r)


def test_filtered_rollouts_and_emptied_groups_take_no_place_in_the_batch():
    rewards, valid, broken, keep = filter_batch()
    released = select_rollouts(rewards, valid, broken, 8, keep=keep, mode="trajectory")
    assert trained(released) == [0, 1, 8, 9, 10, 11, 12, 13]
    filled = select_rollouts(rewards, valid, broken, 2, keep=keep, batch_unit="rollouts")
    assert trained(filled) == trained(released) and int(filled.counts.trainable) == 8
    np.testing.assert_array_equal(np.asarray(filled.indices)[np.asarray(filled.real)], [0, 2, 3])
    ours = select_rollouts(rewards, valid, broken, 2, keep=keep)
    # whole groups of 4 rows: group 1 (no survivor) no longer takes the second slot
    np.testing.assert_array_equal(np.asarray(ours.indices), [0, 2])
    assert trained(ours) == [0, 1, 8, 9, 10, 11] and int(ours.counts.trainable) == 6
    for selection in (released, filled, ours):
        assert (int(selection.counts.no_trainable), int(selection.counts.eligible), int(selection.counts.filtered)) == (
            1,
            3,
            4,
        )
    unfiltered = select_rollouts(rewards, valid, broken, 2)
    np.testing.assert_array_equal(np.asarray(unfiltered.indices), [0, 1])  # no filter: as ranked


def test_the_rollout_unit_skips_a_group_that_no_longer_fits_whole():
    rewards, valid, broken, keep = filter_batch()
    keep[3] = True  # group 3 now has 4 trainable rollouts: 2 + 4 + 4 > 8 rows
    filled = select_rollouts(rewards, valid, broken, 2, keep=keep, batch_unit="rollouts")
    assert trained(filled) == [0, 1, 8, 9, 10, 11] and int(filled.counts.kept) == 2
    with pytest.raises(ValueError, match="batch_unit must be"):
        select_rollouts(rewards, valid, broken, 2, batch_unit="rows")


@pytest.mark.parametrize(
    "mode, unit, num_select", [("group", "groups", 2), ("group", "rollouts", 2), ("trajectory", "groups", 8)]
)
def test_an_all_broken_group_takes_no_slot_when_statistics_count_broken_rollouts(mode, unit, num_select):
    rewards = np.asarray([[1, 0, 0, 0], [1, 1, 0, 0]], np.float32)
    broken = np.asarray([[1, 1, 1, 1], [0, 0, 0, 0]], bool)  # group 0: rewards differ, every rollout broke
    for include, no_trainable in ((True, 1), (False, 0)):
        selection = select_rollouts(
            rewards, np.ones_like(broken), broken, num_select, mode=mode, batch_unit=unit, stats_include_broken=include
        )
        assert trained(selection) == [4, 5, 6, 7]
        assert int(selection.counts.no_trainable) == no_trainable
        if mode == "group" and unit == "groups":
            assert int(np.asarray(selection.indices)[0]) == 1 and int(selection.counts.kept) == 1
