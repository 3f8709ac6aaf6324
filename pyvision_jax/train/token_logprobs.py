"""Per-token logprobs and entropies from decoder hidden states, computed in chunks so the
whole [n, T, V] logits never exist, and the rows of packed batches seen one segment at a
time."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def chunked_token_logprobs(
    hidden: jax.Array, kernel: jax.Array, input_ids: jax.Array, temperature: float, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """logprob [n, T] of each token under softmax(h_{t-1} W / temperature), and the entropy
    [n, T] of that distribution (differentiable: `rl.entropy_coef` trains on it); position 0
    gets 0.

    The [n, chunk, V] logits of one chunk exist at a time, forward and backward.
    """
    n, length, dim = hidden.shape
    shifted = jnp.concatenate([jnp.zeros((n, 1, dim), hidden.dtype), hidden[:, :-1]], axis=1)
    chunk = min(chunk, length)
    padded = -(-length // chunk) * chunk
    if padded != length:
        shifted = jnp.pad(shifted, ((0, 0), (0, padded - length), (0, 0)))
        input_ids = jnp.pad(input_ids, ((0, 0), (0, padded - length)))
    num_chunks = padded // chunk
    h_chunks = shifted.reshape(n, num_chunks, chunk, dim).swapaxes(0, 1)
    id_chunks = input_ids.reshape(n, num_chunks, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(args: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        h, ids = args
        logits = jnp.einsum("ncd,dv->ncv", h, kernel, preferred_element_type=jnp.float32) / temperature
        log_z = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
        probs = jnp.exp(logits - log_z[..., None])
        entropy = log_z - jnp.sum(probs * logits, axis=-1)
        return picked - log_z, entropy

    logprobs, entropy = jax.lax.map(one_chunk, (h_chunks, id_chunks))
    logprobs = logprobs.swapaxes(0, 1).reshape(n, padded)[:, :length]
    entropy = entropy.swapaxes(0, 1).reshape(n, padded)[:, :length]
    first = jnp.arange(length) == 0
    return jnp.where(first, 0.0, logprobs), jnp.where(first, 0.0, entropy)


def segment_rows(values: jax.Array, segments: int) -> jax.Array:
    """Packed [n, T] values as [n * K, T] rows, row (i, k) holding row i's values (to be
    masked to its segment k + 1 with `segment_masks`)."""
    n, length = values.shape
    return jnp.broadcast_to(values[:, None], (n, segments, length)).reshape(n * segments, length)


def segment_masks(mask: jax.Array, segment_ids: jax.Array, segments: int) -> jax.Array:
    """[n * K, T]: `mask` [n, T] restricted, in row (i, k), to segment k + 1 of row i."""
    which = segment_ids[:, None, :] == jnp.arange(1, segments + 1)[None, :, None]
    return (mask[:, None, :] & which).reshape(-1, mask.shape[1])
