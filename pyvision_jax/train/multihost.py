"""Collectives of a multi-process run: process 0's bytes and decisions to every process, and
params gathered from devices of every process to process 0's host.

Every function here is a collective: all processes call it, in the same order, with
arguments of the same structure (process 0's values win). On one process they cost nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from pyvision_jax.convert.tree import host_copy

DEFAULT_CHUNK_BYTES = 256 * 2**20
"""Largest piece of a parameter gathered at once (a stacked leaf is gathered in row blocks)."""


def is_primary() -> bool:
    """Whether this is process 0: the one that reads rollouts and writes files."""
    return jax.process_index() == 0


def broadcast_bytes(payload: bytes | None) -> bytes:
    """Process 0's `payload` on every process (the others pass anything, e.g. None)."""
    if jax.process_count() == 1:
        return payload
    primary = is_primary()
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(payload) if primary else 0)))
    buffer = np.frombuffer(payload, np.uint8) if primary else np.zeros(size, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buffer)).tobytes()


def agree(flag: bool) -> bool:
    """Process 0's `flag` on every process."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.bool_(flag)))


@functools.partial(jax.jit, static_argnums=(2,))
def _rows(leaf: jax.Array, start: jax.Array, count: int) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(leaf, start, count)


def _gather_leaf(leaf: Any, keep: bool, chunk_bytes: int) -> np.ndarray | None:
    """One leaf on this host (None unless `keep`), gathered in blocks of rows of at most
    `chunk_bytes`, so no process holds more than one block beyond its result."""
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
        return host_copy(leaf) if keep else None
    if leaf.ndim == 0 or leaf.nbytes <= chunk_bytes:
        value = multihost_utils.process_allgather(leaf, tiled=True)
        return np.asarray(value) if keep else None
    per_row = leaf.nbytes // leaf.shape[0]
    step = max(1, chunk_bytes // max(per_row, 1))
    out = np.empty(leaf.shape, leaf.dtype) if keep else None
    for start in range(0, leaf.shape[0], step):
        count = min(step, leaf.shape[0] - start)
        block = multihost_utils.process_allgather(_rows(leaf, np.int32(start), count), tiled=True)
        if keep:
            out[start : start + count] = block
        del block
    return out


def gather_to_host(tree: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Any:
    """A numpy copy of `tree` on process 0 (None on the others), gathered leaf by leaf."""
    keep = is_primary()
    leaves, treedef = jax.tree.flatten(tree)
    gathered = [_gather_leaf(leaf, keep, chunk_bytes) for leaf in leaves]
    return jax.tree.unflatten(treedef, gathered) if keep else None
