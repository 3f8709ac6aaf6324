"""The KV cache shared by ``JaxEngine``'s decode slots, and its column bookkeeping.

Cache layout. The model's cache writes every call's tokens at one shared column ``index``.
Each slot keeps its tokens right-aligned: its valid columns are ``[index - length, index)``.
A joining request is prefilled into a small cache of its bucket length and copied into its
slot ending at ``index`` (its leading padding may wrap to the row's free end; joining clears
the row's stale columns); a decode chunk appends ``decode_chunk`` columns to the first rows,
which hold every occupied slot (inactive ones write masked, invalid columns), and leaves the
free rows after them as they are (``permute_rows`` moves occupied rows to the front). When the
cache runs out of room, all rows are shifted left together until the longest active row starts
at column 0 (one jitted roll), and only if that is not enough the cache grows to the next
bucket. The cache length is always one of the length buckets plus
``decode_chunk``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.models import KVCache, ModelConfig


def smallest_bucket(value: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= value, None when value exceeds the largest."""
    position = bisect.bisect_left(buckets, value)
    return buckets[position] if position < len(buckets) else None


class SlotCache:
    """The KV cache [max_batch, S] of the decode slots and its shared write column.

    The engine's jitted prefill and decode read ``cache`` (donating it) and ``index``, and
    store what they return; this class sizes, shifts and grows the cache. ``trace_counts``
    and ``calls`` are the engine's counters, to which the shift and grow functions add.
    """

    def __init__(self, config: ModelConfig, max_batch: int, length_buckets: Sequence[int],
                 decode_chunk: int, dtype: Any, min_length: int, trace_counts: Counter[str],
                 calls: Counter[str]):
        self.config = config
        self.max_batch = max_batch
        self.length_buckets = tuple(length_buckets)
        self.decode_chunk = decode_chunk
        self.dtype = dtype
        self.trace_counts = trace_counts
        self.calls = calls
        self.min_length = self.capacity(min_length)
        self.cache: KVCache | None = None
        self.index = 0
        self._shift = jax.jit(self._shift_impl, donate_argnums=(0,))
        self._grow = jax.jit(self._grow_impl, static_argnums=(1,))
        self._permute = jax.jit(self._permute_impl, donate_argnums=(0,))

    @property
    def compile_counts(self) -> dict[str, int]:
        """Compiled executables of the shift, grow and row-permute functions."""
        return {"shift": self._shift._cache_size(), "grow": self._grow._cache_size(),
                "permute": self._permute._cache_size()}

    def capacity(self, needed: int) -> int:
        """The smallest cache length (bucket + decode_chunk) holding `needed` columns."""
        bucket = smallest_bucket(max(needed - self.decode_chunk, 1), self.length_buckets)
        if bucket is None:
            raise ValueError(f"the KV cache would need {needed} columns, more than the largest "
                             f"length bucket {self.length_buckets[-1]} + {self.decode_chunk}")
        return bucket + self.decode_chunk

    def reset(self, longest_prompt: int) -> None:
        """Sizes the (all free) cache for the call's longest prompt bucket; a cache of the
        right size is reused as it is, since joining rows clear their slot."""
        length = max(self.min_length, self.capacity(
            smallest_bucket(longest_prompt, self.length_buckets) + self.decode_chunk))
        if self.cache is None or self.cache.max_length != length:
            self.cache = KVCache.init(self.config, self.max_batch, length, self.dtype)
            self.index = 0

    def hold_block(self, length: int) -> None:
        """Grows the cache when a prefill block of `length` columns would overlap itself."""
        if self.cache.max_length < length:
            self._grow_to(length + self.decode_chunk)

    def make_room(self, lengths: Iterable[int], index_at_least: int, extra: int) -> None:
        """Moves all rows (of valid `lengths`) so that the write index is >=
        `index_at_least` and `extra` more columns fit after it, growing the cache only if
        shifting is not enough."""
        longest = max(lengths, default=0)
        target = self.index
        if target + extra > self.cache.max_length:
            target = longest  # shift left as far as the longest row allows
        target = max(target, index_at_least)
        if target + extra > self.cache.max_length:
            self._grow_to(target + extra)
        if target != self.index:
            self.cache = self._shift(self.cache, jnp.asarray(target, jnp.int32))
            self.calls["shift"] += 1
            self.index = target

    def permute_rows(self, order: np.ndarray) -> None:
        """Row i of the cache becomes row order[i] (a permutation of the slots); columns and
        the write index stay."""
        self.cache = self._permute(self.cache, jnp.asarray(order))
        self.calls["permute"] += 1

    def _grow_to(self, needed: int) -> None:
        self.cache = self._grow(self.cache, self.capacity(needed))
        self.calls["grow"] += 1

    def _shift_impl(self, cache: KVCache, index: jax.Array) -> KVCache:
        """Moves every row's columns by (index - cache.index); columns >= index are invalid."""
        self.trace_counts["shift"] += 1
        offset = index - cache.index
        roll = lambda x: jnp.roll(x, offset, axis=3)
        valid = jnp.roll(cache.valid, offset, axis=1) & (jnp.arange(cache.max_length) < index)[None, :]
        return KVCache(keys=roll(cache.keys), values=roll(cache.values), valid=valid, index=index)

    def _permute_impl(self, cache: KVCache, order: jax.Array) -> KVCache:
        """Gathers the rows of keys, values and validity in `order`."""
        self.trace_counts["permute"] += 1
        return KVCache(keys=cache.keys[:, order], values=cache.values[:, order],
                       valid=cache.valid[order], index=cache.index)

    def _grow_impl(self, cache: KVCache, length: int) -> KVCache:
        """The same cache with `length` columns (new ones empty and invalid)."""
        self.trace_counts["grow"] += 1
        extra = length - cache.max_length
        pad = lambda x, axis: jnp.pad(x, [(0, extra) if a == axis else (0, 0) for a in range(x.ndim)])
        return KVCache(keys=pad(cache.keys, 3), values=pad(cache.values, 3),
                       valid=pad(cache.valid, 1), index=cache.index)
