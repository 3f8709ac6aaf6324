"""Pure functions that fill the engine's cache rows from a prompt block and sample each row's
first token: ``prefill_rows`` for a fresh prompt, ``extend_rows`` for a prompt continuing the
context a row already holds.

Both take the model inputs of a block [b, T] of left-padded prompts (their M-RoPE positions
included), the slots ``targets`` [b] the rows go to (out of range: dropped, for the padding
rows of a batch) and raw PRNG key data [b, 2]; token 0 of a request is drawn with
``fold_in(key, 0)``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pyvision_jax.models import KVCache, ModelConfig, ModelInputs, forward
from pyvision_jax.rollout.sampling import SamplingArrays, sample_tokens
from pyvision_jax.rollout.slot_cache import compact_columns


def _first_tokens(logits: jax.Array, keys: jax.Array, settings: SamplingArrays) -> tuple[jax.Array, jax.Array]:
    """Token 0 (and its logprob) of each row from the logits [b, T, V] of its block."""
    token_keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(keys), jnp.zeros(keys.shape[0], jnp.int32))
    return sample_tokens(logits[:, -1], token_keys, settings)


def prefill_rows(
    config: ModelConfig,
    compute_dtype: str,
    params: Any,
    cache: KVCache,
    inputs: ModelInputs,
    targets: jax.Array,
    start: jax.Array,
    keys: jax.Array,
    settings: SamplingArrays,
) -> tuple[KVCache, jax.Array, jax.Array]:
    """Runs left-padded prompts into a fresh cache, copies its rows into the slots `targets`
    at columns [start, start + length) and samples each first token.

    `start` may be negative as long as the real tokens fit before the write index: the
    leading padding columns then wrap to the end of the row, past the write index, as
    invalid columns that decoding overwrites."""
    batch, length = inputs.input_ids.shape
    fresh = KVCache.init(config, batch, length, cache.dtype)
    logits, fresh = forward(config, compute_dtype, params, inputs, fresh)
    tokens, logprobs = _first_tokens(logits, keys, settings)
    columns = (start + jnp.arange(length)[None, :]) % cache.max_length
    cleared = cache.replace(valid=cache.valid.at[targets].set(False, mode="drop"))
    return cleared.scatter(targets[:, None], columns, fresh), tokens, logprobs


def extend_rows(
    config: ModelConfig,
    compute_dtype: str,
    params: Any,
    cache: KVCache,
    inputs: ModelInputs,
    targets: jax.Array,
    keep: jax.Array,
    keys: jax.Array,
    settings: SamplingArrays,
) -> tuple[KVCache, jax.Array, jax.Array, jax.Array]:
    """Appends a block of new tokens to the contexts rows `targets` hold: the first keep[b]
    valid columns of row targets[b] are the KV of the prompt's first keep[b] tokens, the
    block holds the rest of the prompt (left-padded), with the positions a prefill of the
    whole prompt gives them.

    Each target row is gathered into a working row of S + T columns, its kept columns
    compacted to end at column S, and the block run after them (it attends to them and to
    itself); the kept and new columns are then compacted to end at the cache's write index,
    which must be at least keep + the block's real tokens. Returns (cache, the block's logits
    [b, T, V], first tokens, their logprobs)."""
    length = inputs.input_ids.shape[1]
    columns = cache.max_length
    rows = cache.map_rows(lambda x: jnp.take(x, targets, axis=0, mode="clip"))
    work = compact_columns(rows, keep, jnp.asarray(columns, jnp.int32), columns + length)
    logits, work = forward(config, compute_dtype, params, inputs, work.replace(index=jnp.asarray(columns, jnp.int32)))
    tokens, logprobs = _first_tokens(logits, keys, settings)
    filled = keep + jnp.sum(inputs.attention_mask, axis=1).astype(keep.dtype)
    rows = compact_columns(work, filled, cache.index, columns)
    return cache.put_rows(targets, rows), logits, tokens, logprobs


def extend_tokens(
    config: ModelConfig,
    compute_dtype: str,
    params: Any,
    cache: KVCache,
    inputs: ModelInputs,
    targets: jax.Array,
    keep: jax.Array,
    keys: jax.Array,
    settings: SamplingArrays,
) -> tuple[KVCache, jax.Array, jax.Array]:
    """`extend_rows` without the block's logits: (cache, first tokens, their logprobs)."""
    cache, _, tokens, logprobs = extend_rows(
        config, compute_dtype, params, cache, inputs, targets, keep, keys, settings
    )
    return cache, tokens, logprobs


def counting(counts: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding one to counts[name] each time it runs: under `jax.jit`, each trace."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return fn(*args, **kwargs)

    traced.__name__ = traced.__qualname__ = name  # profiles and compile logs name it
    return traced
