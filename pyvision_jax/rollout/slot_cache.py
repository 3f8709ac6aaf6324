"""The KV cache shared by ``JaxEngine``'s decode slots, and its column bookkeeping.

Cache layout. The model's cache writes every call's tokens at one shared column ``index``;
every valid column of every row lies before it. Positions never depend on columns (each token
carries its M-RoPE position), so a row's valid columns may sit anywhere before ``index`` as
long as their order is the order of the context: gaps of invalid columns change no logits.
A joining request is prefilled into a small cache of its bucket length and copied into its
slot ending at ``index`` (its leading padding may wrap to the row's free end; joining clears
the row's stale columns); a continued request's row is rebuilt ending at ``index`` (see
``pyvision_jax.rollout.cache_rows``); a decode dispatch appends columns to the first rows,
which hold every active slot (inactive ones write masked, invalid columns), and leaves the
free rows after them as they are (``swap_rows`` moves active rows to the front, trading places
with free or held ones).

``content[row]`` is the number of leading valid columns of the row worth keeping: all of an
active row's, the context of a held row (the columns a stop string's overrun wrote after it
are not), 0 for a free row. When the cache runs out of room, every row's kept columns are
compacted to end at the smallest write index that holds the longest of them (one jitted
gather), and only if that is not enough the cache grows to the next bucket. The cache length
is always one of the length buckets plus ``decode_chunk``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.models import KVCache, ModelConfig


def smallest_bucket(value: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= value, None when value exceeds the largest."""
    position = bisect.bisect_left(buckets, value)
    return buckets[position] if position < len(buckets) else None


def swap_sizes(max_batch: int, decode_batches: Sequence[int]) -> tuple[int, ...]:
    """The pair counts a row swap is padded to: powers of two up to the most pairs a decode
    batch smaller than `max_batch` can need (its rows that are free or held, at most as many as
    the active rows beyond it), that most included; none when every decode uses all rows."""
    most = max((min(rows, max_batch - rows) for rows in decode_batches if rows < max_batch), default=0)
    return tuple(sorted({min(1 << k, most) for k in range(most.bit_length() + 1)} - {0}))


def compact_columns(cache: KVCache, keep: jax.Array, end: jax.Array, length: int) -> KVCache:
    """Rows of `length` columns holding each row's first keep[b] valid columns, in order, at
    columns [end - keep[b], end); every other column is invalid (keep [B]).

    The values are moved, never recomputed, so attention over a compacted row gives the same
    logits. The index is the cache's."""
    columns = cache.max_length
    keep = jnp.minimum(keep, jnp.sum(cache.valid, axis=1))
    order = jnp.argsort(~cache.valid, axis=1, stable=True)  # valid columns first, in column order
    rank = jnp.arange(length)[None, :] - (end - keep)[:, None]
    inside = (rank >= 0) & (rank < keep[:, None])
    source = jnp.take_along_axis(order, jnp.clip(rank, 0, columns - 1), axis=1)
    return cache.gather_columns(source).replace(valid=inside)


class SlotCache:
    """The KV cache [max_batch, S] of the decode slots (max_batch: the largest decode batch
    size), its shared write column and the columns each row keeps (``content``).

    The engine's jitted prefill, extension and decode read ``cache`` (donating it) and
    ``index``, store what they return and keep ``content`` up to date; this class sizes,
    compacts and grows the cache. ``trace_counts`` and ``calls`` are the engine's counters,
    to which the compact, grow and swap functions add. ``placement`` (a sharding) commits
    a new cache where the engine's weights are, so that it enters the jitted functions as their
    outputs do (an uncommitted new cache would compile each of them once more).
    """

    def __init__(
        self,
        config: ModelConfig,
        decode_batches: Sequence[int],
        length_buckets: Sequence[int],
        decode_chunk: int,
        dtype: Any,
        min_length: int,
        trace_counts: Counter[str],
        calls: Counter[str],
        placement: jax.sharding.Sharding | None = None,
    ):
        self.config = config
        self.placement = placement
        self.max_batch = max_batch = decode_batches[-1]
        self.length_buckets = tuple(length_buckets)
        self.decode_chunk = decode_chunk
        self.swap_sizes = swap_sizes(max_batch, decode_batches)
        self.dtype = dtype
        self.trace_counts = trace_counts
        self.calls = calls
        self.min_length = self.capacity(min_length)
        self.cache: KVCache | None = None
        self.index = 0
        self.content = np.zeros(max_batch, np.int64)
        self._compact = jax.jit(self._compact_impl, donate_argnums=(0,))
        self._grow = jax.jit(self._grow_impl, static_argnums=(1,))
        self._swap = jax.jit(self._swap_impl, donate_argnums=(0,))

    @property
    def compile_counts(self) -> dict[str, int]:
        """Compiled executables of the compact, grow and row-swap functions."""
        return {
            "compact": self._compact._cache_size(),
            "grow": self._grow._cache_size(),
            "swap": self._swap._cache_size(),
        }

    def capacity(self, needed: int) -> int:
        """The smallest cache length (bucket + decode_chunk) holding `needed` columns."""
        bucket = smallest_bucket(max(needed - self.decode_chunk, 1), self.length_buckets)
        if bucket is None:
            raise ValueError(
                f"the KV cache would need {needed} columns, more than the largest "
                f"length bucket {self.length_buckets[-1]} + {self.decode_chunk}"
            )
        return bucket + self.decode_chunk

    def span(self, longest_context: int) -> int:
        """The columns a decode dispatch attends to when its rows' contexts have at most
        `longest_context` tokens: the smallest cache length holding them and the dispatch's
        new columns, at most the whole cache."""
        return min(self.capacity(longest_context + self.decode_chunk), self.cache.max_length)

    def reset(self, longest_prompt: int) -> None:
        """Sizes the cache for a call's longest prompt bucket. With no row kept, a cache of
        another size is replaced (a cache of the right size is reused as it is, since joining
        rows clear their slot); with kept rows it only grows, never losing them."""
        length = max(
            self.min_length, self.capacity(smallest_bucket(longest_prompt, self.length_buckets) + self.decode_chunk)
        )
        if self.cache is None or (not self.content.any() and self.cache.max_length != length):
            self.cache = self.empty(length)
            self.index = 0
        elif self.cache.max_length < length:
            self._grow_to(length)

    def empty(self, length: int) -> KVCache:
        """An empty cache of the slots with `length` columns, at ``placement``."""
        return jax.device_put(KVCache.init(self.config, self.max_batch, length, self.dtype), self.placement)

    def hold_block(self, length: int) -> None:
        """Grows the cache when a prefill block of `length` columns would overlap itself."""
        if self.cache.max_length < length:
            self._grow_to(length + self.decode_chunk)

    def make_room(self, index_at_least: int, extra: int) -> None:
        """Moves the write index to >= `index_at_least` with `extra` more columns after it,
        compacting the rows when there is no room after the index, growing the cache only if
        compacting is not enough."""
        target = self.index
        if target + extra > self.cache.max_length:
            target = int(self.content.max())  # as far left as the longest row allows
        target = max(target, index_at_least)
        if target + extra > self.cache.max_length:
            self._grow_to(target + extra)
        if target != self.index:
            self.cache = self._compact(self.cache, jnp.asarray(self.content, jnp.int32), jnp.asarray(target, jnp.int32))
            self.calls["compact"] += 1
            self.index = target

    def swap_rows(self, first: Sequence[int], second: Sequence[int], alongside: list[Any] | None = None) -> None:
        """Rows first[k] and second[k] trade places (distinct rows), and so do those entries of
        `alongside` (the engine's slots); the other rows, the columns and the write index stay.
        Only the swapped rows are read and written, in a dispatch of the smallest pair count of
        ``swap_sizes`` that holds them (padded with the first pair again: every write to a row
        carries the same values)."""
        pairs = len(first)
        size = smallest_bucket(pairs, self.swap_sizes)
        targets = np.array([*first, *second] + [first[0]] * (size - pairs) * 2, np.int32)
        sources = np.array([*second, *first] + [second[0]] * (size - pairs) * 2, np.int32)
        self.cache = self._swap(self.cache, jnp.asarray(targets), jnp.asarray(sources))
        self.content[targets] = self.content[sources]
        if alongside is not None:
            before = list(alongside)
            for target, source in zip(targets[: 2 * pairs], sources[: 2 * pairs]):
                alongside[target] = before[source]
        self.calls["swap"] += 1

    def _grow_to(self, needed: int) -> None:
        self.cache = self._grow(self.cache, self.capacity(needed))
        self.calls["grow"] += 1

    def _compact_impl(self, cache: KVCache, keep: jax.Array, index: jax.Array) -> KVCache:
        """Every row's first keep[row] valid columns moved to end at `index`, the new write
        column."""
        self.trace_counts["compact"] += 1
        return compact_columns(cache, keep, index, cache.max_length).replace(index=index)

    def _swap_impl(self, cache: KVCache, targets: jax.Array, sources: jax.Array) -> KVCache:
        """Rows `targets` of keys, values and validity set to rows `sources` (read before any
        write), in place in the donated cache."""
        self.trace_counts["swap"] += 1
        return cache.map_rows(lambda x: x.at[targets].set(x[sources]))

    def _grow_impl(self, cache: KVCache, length: int) -> KVCache:
        """The same cache with `length` columns (new ones empty and invalid)."""
        self.trace_counts["grow"] += 1
        extra = length - cache.max_length
        return cache.map_columns(
            lambda x, axis: jnp.pad(x, [(0, extra) if a == axis else (0, 0) for a in range(x.ndim)])
        )
