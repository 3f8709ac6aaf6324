"""Streaming safetensors reads and writes with bounded host memory.

The `safetensors` package memory-maps whole files, and every page it touches stays in the
process's resident set until the file is closed, so loading a shard through it costs the
shard's size on top of the converted copy. The format is simple (an 8-byte little-endian
header length, a JSON header, then raw row-major bytes), so we read each tensor with
``readinto`` in row chunks straight into its destination and write likewise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np

Shape = tuple[int, ...]

DEFAULT_CHUNK_BYTES = 16 * 2**20
_HEADER_LIMIT_BYTES = 100 * 2**20

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}


class SafetensorsFormatError(ValueError):
    """A safetensors file whose header or size is inconsistent."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file and absolute byte range."""

    name: str
    file: Path
    dtype: np.dtype
    shape: Shape
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: its name, stored dtype and shape."""

    name: str
    dtype: np.dtype
    shape: Shape

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors dtype string (``BF16``, ``F32``, ...) of a numpy dtype."""
    try:
        return _CODES[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no safetensors encoding") from None


def read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Tensor entries and ``__metadata__`` of one safetensors file, validating offsets."""
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) != 8:
            raise SafetensorsFormatError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_HEADER_LIMIT_BYTES, file_size - 8):
            raise SafetensorsFormatError(f"{path}: header length {header_len} is impossible")
        try:
            header = json.loads(fh.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SafetensorsFormatError(f"{path}: unreadable header ({err})") from None
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    entries = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsFormatError(f"{path}: malformed header entry for tensor {name!r}: {info!r}") from None
        if end - begin != math.prod(shape) * dtype.itemsize or data_start + end > file_size or begin < 0:
            raise SafetensorsFormatError(
                f"{path}: tensor {name!r} ({info['dtype']} {list(shape)}) has inconsistent offsets "
                f"{[begin, end]} for a file of {file_size} bytes"
            )
        entries[name] = TensorEntry(name, path, dtype, shape, data_start + begin, data_start + end)
    return entries, metadata


def read_row_chunks(
    fh: BinaryIO, entry: TensorEntry, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[tuple[int, np.ndarray]]:
    """Yields ``(first_row, rows)`` blocks of a tensor along its leading axis, ~chunk_bytes each."""
    shape = entry.shape if entry.shape else (1,)
    row_bytes = math.prod(shape[1:]) * entry.dtype.itemsize
    rows_per_chunk = max(1, chunk_bytes // max(row_bytes, 1))
    fh.seek(entry.start)
    for first in range(0, shape[0], rows_per_chunk):
        rows = min(rows_per_chunk, shape[0] - first)
        buffer = np.empty((rows, *shape[1:]), dtype=entry.dtype)
        if fh.readinto(memoryview(buffer.reshape(-1).view(np.uint8))) != buffer.nbytes:
            raise SafetensorsFormatError(f"{entry.file}: truncated while reading tensor {entry.name!r}")
        yield first, buffer


def read_tensor(fh: BinaryIO, entry: TensorEntry) -> np.ndarray:
    """The whole tensor as a fresh array (no memory map)."""
    out = np.empty(entry.shape, dtype=entry.dtype)
    flat = out.reshape(out.shape[0] if out.ndim else 1, -1)
    for first, rows in read_row_chunks(fh, entry):
        flat[first : first + rows.shape[0]] = rows.reshape(rows.shape[0], -1)
    return out


def _encoded_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": dtype_code(spec.dtype),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + b" " * (-len(encoded) % 8)


def write_file(
    path: Path,
    specs: Sequence[TensorSpec],
    chunks_of: Callable[[TensorSpec], Iterable[np.ndarray]],
    metadata: Mapping[str, str] | None = None,
    on_tensor_written: Callable[[TensorSpec], None] | None = None,
) -> None:
    """Writes a safetensors file tensor by tensor; ``chunks_of(spec)`` yields the tensor's
    bytes in order as C-contiguous arrays of ``spec.dtype`` (any shapes)."""
    header = _encoded_header(specs, metadata or {"format": "pt"})
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        for spec in specs:
            written = 0
            for chunk in chunks_of(spec):
                if chunk.dtype != spec.dtype or not chunk.flags.c_contiguous:
                    raise ValueError(f"chunk of {spec.name!r} must be C-contiguous {spec.dtype}, got {chunk.dtype}")
                fh.write(memoryview(chunk.reshape(-1).view(np.uint8)))
                written += chunk.nbytes
            if written != spec.nbytes:
                raise ValueError(f"tensor {spec.name!r}: wrote {written} bytes, expected {spec.nbytes}")
            if on_tensor_written is not None:
                on_tensor_written(spec)
