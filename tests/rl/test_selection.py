import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pyvision_jax.rl import select_rollouts, take_selected
from tests.rl import numpy_reference as ref

P, G = 12, 6
select = jax.jit(
    select_rollouts, static_argnames=("num_select", "mode", "min_members", "drop_groups_with_broken")
)


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
    return jax.jit(functools.partial(
        select_rollouts, num_select=num_select, mode=mode, min_members=min_members,
        drop_groups_with_broken=drop_groups_with_broken,
    ))


def assert_matches_reference(selection, expected, rank_values):
    """Same number of real entries, real ones first, unique, and the same ranking values.

    Values that tie only up to float rounding may be ordered either way, so indices are
    compared exactly only where the reference's values are separated.
    """
    real = np.asarray(selection.real)
    indices = np.asarray(selection.indices)
    assert real.sum() == len(expected)
    assert real[: len(expected)].all() and not real[len(expected):].any()
    chosen = indices[: len(expected)]
    assert len(set(chosen.tolist())) == len(chosen)
    np.testing.assert_allclose(rank_values[chosen], rank_values[expected], atol=1e-5)
    separated = np.isclose(rank_values[expected][:, None], rank_values[None, :], atol=1e-5).sum(axis=1) == 1
    np.testing.assert_array_equal(chosen[separated], np.asarray(expected, int)[separated])


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_select=st.sampled_from([3, 12]),
    policy=st.sampled_from([(2, False), (1, True), (4, False)]),
)
def test_group_mode_matches_reference(seed, num_select, policy):
    min_members, drop_groups_with_broken = policy
    rewards, valid, broken = random_batch(seed)
    selection = jitted_select(num_select, "group", min_members, drop_groups_with_broken)(rewards, valid, broken)
    expected, outcomes = ref.select(
        rewards, valid, broken, num_select, min_members=min_members,
        drop_groups_with_broken=drop_groups_with_broken,
    )
    _, std, _ = ref.group_outcomes(rewards, valid, broken, std_eps=1e-6, min_members=min_members,
                                   drop_groups_with_broken=drop_groups_with_broken)
    assert_matches_reference(selection, expected, std)
    counts = selection.counts
    assert int(counts.groups) == sum(o != "padding" for o in outcomes)
    assert int(counts.zero_variance) == outcomes.count("zero_variance")
    assert int(counts.too_few_members) == outcomes.count("too_few")
    assert int(counts.broken_groups_dropped) == outcomes.count("broken")
    assert int(counts.eligible) == outcomes.count("eligible")
    assert int(counts.kept) == len(expected)
    assert int(counts.broken_rollouts) == int((valid & broken).sum())
    assert (counts.zero_variance + counts.too_few_members + counts.broken_groups_dropped
            + counts.eligible) == counts.groups
    for index in np.asarray(selection.indices)[np.asarray(selection.real)]:
        assert outcomes[index] == "eligible" and std[index] > 1e-6


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_select=st.sampled_from([10, 40]))
def test_trajectory_mode_matches_reference(seed, num_select):
    rewards, valid, broken = random_batch(seed)
    selection = jitted_select(num_select, "trajectory", 2, False)(rewards, valid, broken)
    expected, _ = ref.select(rewards, valid, broken, num_select, mode="trajectory")
    _, _, unbiased = ref.group_outcomes(rewards, valid, broken, std_eps=1e-6, min_members=2,
                                        drop_groups_with_broken=False)
    assert_matches_reference(selection, expected, np.repeat(unbiased, G))
    np.testing.assert_array_equal(selection.rollout_indices, selection.indices)
    chosen = np.asarray(selection.indices)[np.asarray(selection.real)]
    assert not broken.reshape(-1)[chosen].any() and valid.reshape(-1)[chosen].all()


def test_ranking_by_std_with_ties_to_lower_index():
    rewards = np.array([
        [1, 1, 1, 1],  # zero variance
        [1, 0, 0, 0],  # std sqrt(3)/4
        [1, 1, 0, 0],  # std 1/2
        [0, 0, 0, 1],  # ties group 1
        [0, 1, 0, 1],  # ties group 2
        [0, 0, 0, 0],  # zero variance
    ], np.float32)
    valid = np.ones_like(rewards, bool)
    broken = np.zeros_like(valid)
    selection = select(rewards, valid, broken, num_select=5)
    np.testing.assert_array_equal(selection.indices[:4], [2, 4, 1, 3])
    np.testing.assert_array_equal(selection.real, [True, True, True, True, False])
    assert int(selection.counts.zero_variance) == 2 and int(selection.counts.kept) == 4
    assert selection.rollout_indices.shape == (20,)
    np.testing.assert_array_equal(selection.rollout_indices[:4], [8, 9, 10, 11])
    assert not np.asarray(selection.rollout_real)[16:].any()


def test_trajectory_mode_ranks_by_unbiased_std_and_may_split_groups():
    rewards = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    valid = np.ones_like(rewards, bool)
    broken = np.zeros_like(valid)
    broken[1, 3] = True  # group 1 usable [1, 1, 0]: unbiased std 0.577 > group 0's 0.5
    selection = select(rewards, valid, broken, num_select=5, mode="trajectory")
    np.testing.assert_array_equal(selection.indices, [4, 5, 6, 0, 1])
    assert np.asarray(selection.real).all()


def test_broken_policy_and_min_members():
    rewards = np.array([[1, 0, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    valid = np.ones_like(rewards, bool)
    valid[2, 2:] = False
    broken = np.zeros_like(valid)
    broken[0, 0] = True
    keep = select(rewards, valid, broken, num_select=3)
    drop = select(rewards, valid, broken, num_select=3, drop_groups_with_broken=True)
    strict = select(rewards, valid, broken, num_select=3, min_members=3)
    assert set(np.asarray(keep.indices)[np.asarray(keep.real)].tolist()) == {0, 1, 2}
    assert np.asarray(drop.indices)[np.asarray(drop.real)].tolist() == [2, 1]
    assert int(drop.counts.broken_groups_dropped) == 1
    assert np.asarray(strict.indices)[np.asarray(strict.real)].tolist() == [0, 1]  # std 0.47 > 0.43
    assert int(strict.counts.too_few_members) == 1
    # the broken rollout of a kept group never trains
    position = np.asarray(keep.indices).tolist().index(0)
    assert not np.asarray(keep.rollout_real).reshape(3, 4)[position, 0]


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
    plain = select(rewards, valid, broken, num_select=6)
    padded = select(padded_rewards, padded_valid, padded_broken, num_select=6)
    _, std, _ = ref.group_outcomes(rewards, valid, broken, std_eps=1e-6, min_members=2,
                                   drop_groups_with_broken=False)
    plain_choice = np.asarray(plain.indices)[np.asarray(plain.real)]
    assert_matches_reference(padded, plain_choice, np.concatenate([std, np.zeros(4)]))
    for name in ("groups", "zero_variance", "too_few_members", "eligible", "kept"):
        assert int(getattr(plain.counts, name)) == int(getattr(padded.counts, name))


def test_jit_equals_eager_and_take_selected():
    rewards, valid, broken = random_batch(7)
    eager = select_rollouts(rewards, valid, broken, 5)
    jitted = jitted_select(5, "group", 2, False)(rewards, valid, broken)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(a, b)
    gathered = take_selected(rewards, eager)
    expected = rewards[np.asarray(eager.indices)].reshape(-1)
    np.testing.assert_array_equal(gathered, expected)
    extra = np.arange(P * G * 3).reshape(P, G, 3)
    assert take_selected(extra, eager).shape == (5 * G, 3)


def test_bad_arguments_raise_clear_errors():
    rewards, valid, broken = random_batch(0)
    with pytest.raises(ValueError, match="num_select=13"):
        select_rollouts(rewards, valid, broken, P + 1)
    with pytest.raises(ValueError, match="mode must be"):
        select_rollouts(rewards, valid, broken, 2, mode="groups")
