import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvision_jax.rl import group_advantages
from tests.rl import numpy_reference as ref

P, G = 12, 6  # the same shapes as the selection tests, so eager primitives compile once
advantages = jax.jit(group_advantages, static_argnames=("normalize_std", "mean_over_full_group"))


def random_batch(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([0.0, 0.5, 1.0, 1.2, 1.3], size=(P, G)).astype(np.float32)
    valid = rng.random((P, G)) < 0.85
    broken = (rng.random((P, G)) < 0.15) & valid
    return rewards, valid, broken


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    normalize_std=st.booleans(),
    mean_over_full_group=st.booleans(),
    negative_weight=st.sampled_from([1.0, 0.25, 0.0]),
)
def test_matches_reference(seed, normalize_std, mean_over_full_group, negative_weight):
    rewards, valid, broken = random_batch(seed)
    got = advantages(
        rewards,
        valid,
        broken,
        normalize_std=normalize_std,
        mean_over_full_group=mean_over_full_group,
        negative_weight=negative_weight,
    )
    expected = ref.advantages(
        rewards,
        valid,
        broken,
        normalize_std=normalize_std,
        mean_over_full_group=mean_over_full_group,
        negative_weight=negative_weight,
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert np.all(np.asarray(got)[~(valid & ~broken)] == 0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_unnormalized_advantages_sum_to_zero_over_each_usable_group(seed):
    rewards, valid, broken = random_batch(seed)
    got = np.asarray(advantages(rewards, valid, broken, normalize_std=False, mean_over_full_group=False))
    np.testing.assert_allclose(got.sum(axis=1), 0.0, atol=1e-5)


def one_group(rewards, broken):
    """A hand-written group as row 0 of a [P, G] batch of padding (reuses compiles)."""
    batch = np.full((P, G), 3.0, np.float32), np.zeros((P, G), bool), np.zeros((P, G), bool)
    batch[0][0, : len(rewards)] = rewards
    batch[1][0, : len(rewards)] = True
    batch[2][0, : len(rewards)] = broken
    return batch


def test_full_group_baseline_includes_broken_rollouts():
    batch = one_group([1.0, 0.0, 0.0, 1.0], [False, False, False, True])
    filtered = np.asarray(advantages(*batch, normalize_std=False, mean_over_full_group=False))
    official = np.asarray(advantages(*batch, normalize_std=False, mean_over_full_group=True))
    np.testing.assert_allclose(filtered[0, :4], [2 / 3, -1 / 3, -1 / 3, 0.0], atol=1e-6)
    np.testing.assert_allclose(official[0, :4], [0.5, -0.5, -0.5, 0.0], atol=1e-6)
    assert not filtered[1:].any() and not official[:, 4:].any()


def test_negative_weight_scales_only_the_negative_advantages():
    batch = one_group([1.0, 0.0, 0.0, 0.0], [False] * 4)
    got = np.asarray(advantages(*batch, normalize_std=False, mean_over_full_group=False, negative_weight=0.1))
    np.testing.assert_allclose(got[0, :4], [0.75, -0.025, -0.025, -0.025], atol=1e-6)


def test_normalized_by_unbiased_std():
    batch = one_group([1.0, 0.0, 1.0, 0.0], [False] * 4)
    got = np.asarray(advantages(*batch, normalize_std=True, mean_over_full_group=False))[0, :4]
    np.testing.assert_allclose(got, np.array([0.5, -0.5, 0.5, -0.5]) / (np.sqrt(1 / 3) + 1e-6), rtol=1e-5)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_padding_never_changes_advantages(seed):
    normalize_std = True
    rewards, valid, broken = random_batch(seed)
    rng = np.random.default_rng(seed)
    padded_rewards = (rng.normal(size=(P + 3, G + 2)) * 1e6).astype(np.float32)
    padded_rewards[:P, :G] = rewards
    padded_valid = np.zeros((P + 3, G + 2), bool)
    padded_valid[:P, :G] = valid
    padded_broken = rng.random((P + 3, G + 2)) < 0.5
    padded_broken[:P, :G] = broken
    plain = advantages(rewards, valid, broken, normalize_std=normalize_std, mean_over_full_group=False)
    padded = advantages(
        padded_rewards, padded_valid, padded_broken, normalize_std=normalize_std, mean_over_full_group=False
    )
    np.testing.assert_allclose(np.asarray(padded)[:P, :G], plain, rtol=1e-6, atol=1e-6)
    assert not np.asarray(padded)[P:].any() and not np.asarray(padded)[:, G:].any()


def test_jit_equals_eager():
    rewards, valid, broken = random_batch(3)
    for normalize_std in (False, True):
        eager = group_advantages(rewards, valid, broken, normalize_std=normalize_std)
        jitted = advantages(rewards, valid, broken, normalize_std=normalize_std, mean_over_full_group=False)
        np.testing.assert_allclose(eager, jitted, rtol=1e-6, atol=1e-7)


def test_equal_rewards_give_exactly_zero_advantage_even_normalized():
    # Summing e.g. 0.11 three times in float32 and dividing by 3 does not give back 0.11; the
    # tiny deviations, divided by a tiny std, would otherwise become advantages of ~0.1.
    values = np.array([0.11, 0.22, 0.43, 0.03, 0.06, 0.12, 0.01, 0.04, 0.08, 0.05, 1.1, 1.3], np.float32)
    rewards = np.repeat(values[:, None], G, axis=1)
    valid = np.arange(G)[None, :] < np.array([3, 3, 3, 5, 5, 5, 6, 6, 6, 4, 3, 5])[:, None]
    for normalize_std in (False, True):
        got = np.asarray(
            advantages(rewards, valid, np.zeros_like(valid), normalize_std=normalize_std, mean_over_full_group=False)
        )
        assert not got.any()
