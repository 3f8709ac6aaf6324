"""The decode slots' cache: row swaps that move active rows to the front of a decode batch."""

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.models import KVCache, ModelConfig
from pyvision_jax.rollout.slot_cache import SlotCache, swap_sizes


@pytest.mark.parametrize(
    "max_batch, decode_batches, expected",
    [
        (32, (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16)),  # a 16-row decode of 32 slots: 16 pairs at most
        (4, (1, 4), (1,)),
        (24, (8, 24), (1, 2, 4, 8)),
        (24, (12, 24), (1, 2, 4, 8, 12)),  # the most pairs, not the next power of two
        (8, (8,), ()),  # every decode uses all rows: nothing to swap
    ],
)
def test_swap_sizes_are_powers_of_two_up_to_the_most_pairs_a_decode_batch_needs(max_batch, decode_batches, expected):
    assert swap_sizes(max_batch, decode_batches) == expected


@pytest.mark.parametrize("first, second", [([0, 2], [5, 3]), ([1, 0, 2], [7, 6, 4])])  # 3 pairs: padded to 4
def test_swapped_rows_trade_places_and_every_other_row_stays(first, second):
    config = ModelConfig.preset("tiny")
    slots = SlotCache(config, (2, 4, 8), (16,), 4, jnp.float32, 16, Counter(), Counter())
    assert slots.swap_sizes == (1, 2, 4)
    empty = KVCache.init(config, 8, 20)
    draws = iter(jax.random.split(jax.random.key(0), 2 * config.num_hidden_layers))
    noise = lambda x: jax.random.normal(next(draws), x.shape, x.dtype)
    slots.cache = empty.replace(
        keys=tuple(map(noise, empty.keys)),
        values=tuple(map(noise, empty.values)),
        valid=jnp.arange(8)[:, None] > jnp.arange(20)[None, :],  # row r: its first r columns
        index=jnp.asarray(13, jnp.int32),
    )
    slots.index, slots.content = 13, np.arange(8) * 10
    before = jax.tree.map(np.asarray, slots.cache)

    names = [f"slot {row}" for row in range(8)]
    slots.swap_rows(first, second, alongside=names)

    order = np.arange(8)
    order[first], order[second] = second, first
    after = jax.tree.map(np.asarray, slots.cache)
    for got, was in zip([*after.keys, *after.values, after.valid], [*before.keys, *before.values, before.valid]):
        np.testing.assert_array_equal(got, was[order])
    assert int(after.index) == slots.index == 13
    assert slots.content.tolist() == (order * 10).tolist()
    assert names == [f"slot {row}" for row in order]
    assert slots.calls["swap"] == 1 and slots.compile_counts["swap"] == 1
