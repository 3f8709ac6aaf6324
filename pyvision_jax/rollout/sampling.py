"""Pure, jittable token sampling: temperature, top-k and top-p filtering, and logprobs.

The distribution a token is drawn from, and whose log-probability is reported, is

    p = softmax(filter(logits / temperature))

where ``filter`` keeps the ``top_k`` most likely tokens (``top_k <= 0``: all) and then the
smallest set of the most likely remaining tokens whose probability reaches ``top_p``
(``top_p >= 1``: all), setting the others to -inf, so ``p`` is renormalised over the kept
tokens. With both filters disabled this is exactly ``log_softmax(logits / temperature)``, the
tempered full distribution the trainer recomputes from its own forward pass.

``temperature == 0`` is greedy decoding: the token is the argmax of the logits (first index on
ties) and its reported logprob is ``log_softmax(logits)`` of that token, i.e. of the untempered,
unfiltered distribution (a point mass would always give 0 and tell the trainer nothing).

The settings are traced scalars, so changing them never recompiles; the sort needed by the
filters only runs when one of them is enabled.

A sampled token is drawn by inverting the cumulative distribution with one uniform per row
(from that row's key), not with noise per vocabulary entry: the vocabulary is cut into blocks,
the first block whose running total exceeds ``u * total`` is found from the block totals, and
the token is found inside that one block. Tokens of probability 0 are never drawn, whatever the
round-off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SamplingArrays:
    """The per-call sampling settings as device scalars (traced, not static)."""

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def create(cls, temperature: float, top_k: int, top_p: float) -> "SamplingArrays":
        return cls(
            temperature=jnp.asarray(temperature, jnp.float32),
            top_k=jnp.asarray(top_k, jnp.int32),
            top_p=jnp.asarray(top_p, jnp.float32),
        )


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Sets logits [B, V] outside the top-k / top-p sets to -inf (per row)."""
    vocab = logits.shape[-1]
    order = jnp.argsort(-logits, axis=-1)  # stable: ties keep index order
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    rank = jnp.arange(vocab)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    keep_sorted = rank[None, :] < k
    sorted_logits = jnp.where(keep_sorted, sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted &= (mass_before < top_p) | (rank[None, :] == 0)
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
    return jnp.where(keep, logits, -jnp.inf)


def sampling_log_probs(logits: jax.Array, settings: SamplingArrays) -> jax.Array:
    """log p [B, V] of the sampling distribution (see the module docstring)."""
    logits = logits.astype(jnp.float32)
    greedy = settings.temperature <= 0
    tempered = logits / jnp.where(greedy, 1.0, settings.temperature)
    filtering = (~greedy) & ((settings.top_k > 0) | (settings.top_p < 1))
    tempered = jax.lax.cond(filtering, filter_logits, lambda x, k, p: x, tempered, settings.top_k, settings.top_p)
    return jax.nn.log_softmax(tempered, axis=-1)


def _first_above(running: jax.Array, probs: jax.Array, threshold: jax.Array) -> jax.Array:
    """Per row, the first index whose running total [B, n] exceeds threshold [B] among entries
    of probability > 0, else the last entry of probability > 0 (threshold past the total by
    round-off)."""
    positive = probs > 0
    above = (running > threshold[:, None]) & positive
    last_positive = running.shape[-1] - 1 - jnp.argmax(positive[:, ::-1], axis=-1)
    return jnp.where(jnp.any(above, axis=-1), jnp.argmax(above, axis=-1), last_positive)


def _block_size(vocab: int) -> int:
    """Block length for the two-level search: the whole row when short, else the largest
    divisor of the vocabulary in [64, 512] (no ragged last block), else 512."""
    if vocab <= 512:
        return vocab
    return next((size for size in range(512, 63, -1) if vocab % size == 0), 512)


def inverse_cdf_tokens(log_probs: jax.Array, uniforms: jax.Array) -> jax.Array:
    """Token ids [B] int32 drawn from log p [B, V] by uniforms [B] in [0, 1): per row the first
    token whose cumulative probability exceeds u times the row's total (of probability > 0)."""
    rows, vocab = log_probs.shape
    block = _block_size(vocab)
    whole = vocab // block
    totals = jnp.sum(jnp.exp(log_probs[:, : whole * block]).reshape(rows, whole, block), axis=-1)
    if whole * block < vocab:  # a ragged last block
        tail = jnp.sum(jnp.exp(log_probs[:, whole * block :]), axis=-1, keepdims=True)
        totals = jnp.concatenate([totals, tail], axis=-1)
    running = jnp.cumsum(totals, axis=-1)
    threshold = uniforms * running[:, -1]
    chosen = _first_above(running, totals, threshold)
    row = jnp.arange(rows)
    remaining = threshold - (running - totals)[row, chosen]
    begin = chosen * block
    start = jnp.minimum(begin, vocab - block)  # the ragged block is read as the last `block` entries
    index = start[:, None] + jnp.arange(block)[None, :]
    probs = jnp.where(index >= begin[:, None], jnp.exp(jnp.take_along_axis(log_probs, index, axis=-1)), 0.0)
    tokens = start + _first_above(jnp.cumsum(probs, axis=-1), probs, remaining)
    # Unreachable unless exp rounds differently between the two levels; the row's mode then
    # stands in (a cond, since an argmax over the vocabulary costs more than the draw).
    drawable = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0] > -jnp.inf
    tokens = jax.lax.cond(
        jnp.all(drawable), lambda: tokens, lambda: jnp.where(drawable, tokens, jnp.argmax(log_probs, axis=-1))
    )
    return tokens.astype(jnp.int32)


def sample_tokens(logits: jax.Array, keys: jax.Array, settings: SamplingArrays) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row of logits [B, V] with typed PRNG keys [B].

    Returns (token ids [B] int32, their logprobs [B] float32 under the sampling distribution).
    """
    log_probs = sampling_log_probs(logits, settings)

    def draw() -> jax.Array:
        uniforms = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys)
        return inverse_cdf_tokens(log_probs, uniforms)

    tokens = jax.lax.cond(
        settings.temperature <= 0,
        lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32),
        draw,
    )
    return tokens, jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
