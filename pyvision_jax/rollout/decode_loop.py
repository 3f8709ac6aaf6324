"""The engine's decode dispatch: one compiled loop of up to ``max_steps`` decode steps over
the first rows of the cache, which stops as soon as every row has ended.

Live span. Every live row's context ends at the write index, so a dispatch need attend only
to the columns from its longest context's start to the index plus ``max_steps``: with a
``span`` (a static bucket) shorter than the cache, or fewer rows than the cache holds, the
dispatch copies those rows' last ``span`` columns out once, runs its steps on the copy, and
writes back only the ``max_steps`` columns from the write index on, which are all it changes
(the engine leaves that many free columns after the index). Positions are carried, not
derived from columns, so the window changes no logits.

Step t feeds each live row its last token at position ``positions + t`` and draws the next
with ``fold_in(key, counts + t)`` (``counts``: the tokens the request has so far), the key
a single-step dispatch uses for that token, so the tokens do not depend on how many steps
a dispatch runs. A row ends in the loop when it draws a token of ``stop_mask`` (the
end-of-turn and stop token ids) or reaches its token limit; from then on it feeds nothing
(its columns are written invalid), so its cache row holds exactly its context. Stop strings
need the host's incremental detokenization: a row whose stop string completes goes on to the
end of the dispatch, and the host discards what it drew after the stop.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pyvision_jax.models import KVCache, ModelConfig, ModelInputs, forward
from pyvision_jax.rollout.sampling import SamplingArrays, sample_tokens


def decode_steps(
    config: ModelConfig,
    compute_dtype: str,
    max_steps: int,
    params: Any,
    cache: KVCache,
    tokens: jax.Array,
    positions: jax.Array,
    live: jax.Array,
    counts: jax.Array,
    limits: jax.Array,
    keys: jax.Array,
    stop_mask: jax.Array,
    settings: SamplingArrays,
    span: int = 0,
) -> tuple[KVCache, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Decodes the first len(tokens) rows of `cache` (the others are kept as they are),
    attending to the `span` columns (static; 0: all) that end `max_steps` after the write
    index, which must hold every live row's context.

    tokens, positions, live, counts, limits [r] are each row's last token (not yet in the
    cache), its M-RoPE position, whether it decodes, its tokens so far and its token limit;
    keys [r, 2] raw PRNG key data; stop_mask [V] bool. Returns (cache, tokens [r, max_steps],
    logprobs [r, max_steps], tokens drawn per row [r], steps run); a row's tokens are its
    first `drawn` entries."""
    rows = tokens.shape[0]
    typed_keys = jax.random.wrap_key_data(keys)
    full = cache
    span = full.max_length if span <= 0 else min(span, full.max_length)
    windowed = rows < full.valid.shape[0] or span < full.max_length
    if windowed:
        first = jnp.clip(full.index + max_steps - span, 0, full.max_length - span)
        cache = full.window(rows, first, span).replace(index=full.index - first)

    def running(carry: tuple) -> jax.Array:
        step, _, _, live, *_ = carry
        return (step < max_steps) & jnp.any(live)

    def step_once(carry: tuple) -> tuple:
        step, cache, last, live, drawn, out_tokens, out_logprobs = carry
        pos = jnp.broadcast_to((positions + step)[None, :, None], (3, rows, 1))
        inputs = ModelInputs(input_ids=last[:, None], attention_mask=live[:, None], positions=pos)
        logits, cache = forward(config, compute_dtype, params, inputs, cache)
        step_keys = jax.vmap(jax.random.fold_in)(typed_keys, counts + step)
        new, logprobs = sample_tokens(logits[:, 0], step_keys, settings)
        out_tokens = out_tokens.at[:, step].set(new)
        out_logprobs = out_logprobs.at[:, step].set(logprobs)
        drawn = drawn + live.astype(jnp.int32)
        ended = stop_mask[new] | (counts + step + 1 >= limits)
        return step + 1, cache, new, live & ~ended, drawn, out_tokens, out_logprobs

    start = (
        jnp.zeros((), jnp.int32),
        cache,
        tokens,
        live,
        jnp.zeros(rows, jnp.int32),
        jnp.zeros((rows, max_steps), jnp.int32),
        jnp.zeros((rows, max_steps), jnp.float32),
    )
    steps, cache, _, _, drawn, out_tokens, out_logprobs = jax.lax.while_loop(running, step_once, start)
    if windowed:  # only the dispatch's columns changed: write back those
        written = cache.window(rows, full.index - first, max_steps).replace(index=cache.index + first)
        cache = full.put_window(full.index, written)
    return cache, out_tokens, out_logprobs, drawn, steps
