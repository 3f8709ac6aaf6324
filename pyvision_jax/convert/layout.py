"""Array layout transforms between HF tensors and Flax leaves, done in row chunks so that a
transpose or dtype cast never holds more than one extra chunk beside the destination."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from pyvision_jax.convert.names import TensorKind
from pyvision_jax.convert.safetensors_io import DEFAULT_CHUNK_BYTES, TensorEntry, read_row_chunks

_TRANSPOSED = (TensorKind.LINEAR_WEIGHT, TensorKind.CONV_WEIGHT)


def read_flax_leaf(fh: BinaryIO, entry: TensorEntry, kind: TensorKind, dtype: np.dtype | None = None) -> np.ndarray:
    """Reads HF tensor ``entry`` from ``fh`` into a new array in the Flax layout of ``kind``.

    Linear ``[out, in]`` becomes ``[in, out]``; the Conv3d patch embedding ``[D, C, T, P, P]``
    becomes ``[C*T*P*P, D]``; everything else keeps its shape. ``dtype=None`` keeps the stored one.
    """
    dtype = np.dtype(dtype or entry.dtype)
    if kind in _TRANSPOSED:
        rows = entry.shape[0]
        out = np.empty((math.prod(entry.shape[1:]), rows), dtype=dtype)
        for first, chunk in read_row_chunks(fh, entry):
            out[:, first : first + chunk.shape[0]] = chunk.reshape(chunk.shape[0], -1).T
        return out
    out = np.empty(entry.shape, dtype=dtype)
    flat = out.reshape(out.shape[0] if out.ndim else 1, -1)
    for first, chunk in read_row_chunks(fh, entry):
        flat[first : first + chunk.shape[0]] = chunk.reshape(chunk.shape[0], -1)
    return out


def hf_chunks(
    leaf: np.ndarray, kind: TensorKind, dtype: np.dtype | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[np.ndarray]:
    """Yields the bytes of a Flax leaf in HF layout (row-major), as contiguous chunks of ``dtype``."""
    dtype = np.dtype(dtype or leaf.dtype)
    rows_view = leaf.T if kind in _TRANSPOSED else leaf.reshape(leaf.shape[0] if leaf.ndim else 1, -1)
    row_bytes = math.prod(rows_view.shape[1:]) * max(dtype.itemsize, leaf.dtype.itemsize)
    rows_per_chunk = max(1, chunk_bytes // max(row_bytes, 1))
    for first in range(0, rows_view.shape[0], rows_per_chunk):
        yield np.ascontiguousarray(rows_view[first : first + rows_per_chunk], dtype=dtype)
