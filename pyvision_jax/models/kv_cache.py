"""The decoder's KV cache and its layout: one array pair per layer, keys column-last.

Each layer has its own arrays, so a layer reads and writes its cache in place (a stacked
[L, ...] array reached from inside the layer loop would be sliced, which is a copy of the
layer's whole cache on every step). Keys are stored [B, kv_heads, head_dim, S] and values
[B, kv_heads, S, head_dim]: a decoding query's scores (q . K) and its output (p . V) then both
stream their operand's rows contiguously. Every write puts a call's tokens at the shared
column ``index``; ``valid`` [B, S] marks the columns that hold a token.

The row and column operations the engine's slot bookkeeping needs live here too, beside the
layout they depend on.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from pyvision_jax.models.config import ModelConfig

KEY_COLUMN_AXIS = 3
VALUE_COLUMN_AXIS = 2


@struct.dataclass
class KVCache:
    """Per layer keys [B, KVH, d, S] and values [B, KVH, S, d], slot validity [B, S], next
    write column."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array

    @classmethod
    def init(cls, config: ModelConfig, batch: int, max_length: int, dtype: Any = jnp.float32) -> "KVCache":
        heads, dim, layers = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        return cls(
            keys=tuple(jnp.zeros((batch, heads, dim, max_length), dtype) for _ in range(layers)),
            values=tuple(jnp.zeros((batch, heads, max_length, dim), dtype) for _ in range(layers)),
            valid=jnp.zeros((batch, max_length), bool),
            index=jnp.zeros((), jnp.int32),
        )

    @property
    def max_length(self) -> int:
        return self.valid.shape[1]

    @property
    def dtype(self) -> Any:
        return self.keys[0].dtype

    def map_rows(self, fn: Callable[[jax.Array], jax.Array]) -> "KVCache":
        """`fn` applied to every array along its leading (row) axis; the index stays."""
        return self.replace(keys=tuple(map(fn, self.keys)), values=tuple(map(fn, self.values)), valid=fn(self.valid))

    def map_columns(self, fn: Callable[[jax.Array, int], jax.Array]) -> "KVCache":
        """`fn(array, column_axis)` applied to every array; the index stays."""
        return self.replace(
            keys=tuple(fn(k, KEY_COLUMN_AXIS) for k in self.keys),
            values=tuple(fn(v, VALUE_COLUMN_AXIS) for v in self.values),
            valid=fn(self.valid, 1),
        )

    def put_rows(self, rows: jax.Array, other: "KVCache") -> "KVCache":
        """Rows `rows` replaced by `other`'s rows (out-of-range rows dropped)."""
        put = lambda big, small: big.at[rows].set(small.astype(big.dtype), mode="drop")
        return self.replace(
            keys=tuple(map(put, self.keys, other.keys)),
            values=tuple(map(put, self.values, other.values)),
            valid=put(self.valid, other.valid),
        )

    def gather_columns(self, source: jax.Array) -> "KVCache":
        """Rows whose column j is column source[b, j] of row b (source [B, S'])."""

        def gather(x: jax.Array, axis: int) -> jax.Array:
            shape = [source.shape[0]] + [1] * (x.ndim - 1)
            shape[axis] = source.shape[1]
            return jnp.take_along_axis(x, source.reshape(shape), axis=axis)

        return self.map_columns(gather)

    def scatter(self, rows: jax.Array, columns: jax.Array, fresh: "KVCache") -> "KVCache":
        """Column j of `fresh`'s row b put at (rows[b], columns[b, j]) (rows [b, 1], columns
        [b, T]; out-of-range rows dropped); validity included."""

        def place(big: jax.Array, small: jax.Array, axis: int) -> jax.Array:
            small = jnp.moveaxis(small, axis, 1).astype(big.dtype)  # [b, T, ...] like the index result
            index = (rows,) + (slice(None),) * (axis - 1) + (columns,)
            return big.at[index].set(small, mode="drop")

        return self.replace(
            keys=tuple(place(b, s, KEY_COLUMN_AXIS) for b, s in zip(self.keys, fresh.keys)),
            values=tuple(place(b, s, VALUE_COLUMN_AXIS) for b, s in zip(self.values, fresh.values)),
            valid=self.valid.at[rows, columns].set(fresh.valid, mode="drop"),
        )

    def window(self, rows: int, start: jax.Array, length: int) -> "KVCache":
        """The first `rows` rows' columns [start, start + length) (a copy)."""
        return self.map_columns(
            lambda x, axis: jax.lax.dynamic_slice_in_dim(jax.lax.slice_in_dim(x, 0, rows, axis=0), start, length, axis)
        )

    def put_window(self, start: jax.Array, window: "KVCache") -> "KVCache":
        """`window`'s arrays written at rows [0, rows), columns from `start` on; the index is
        `window`'s."""

        def put(big: jax.Array, small: jax.Array, axis: int) -> jax.Array:
            origin = [0] * big.ndim
            origin[axis] = start
            return jax.lax.dynamic_update_slice(big, small.astype(big.dtype), origin)

        return self.replace(
            keys=tuple(put(b, s, KEY_COLUMN_AXIS) for b, s in zip(self.keys, window.keys)),
            values=tuple(put(b, s, VALUE_COLUMN_AXIS) for b, s in zip(self.values, window.values)),
            valid=put(self.valid, window.valid, 1),
            index=window.index,
        )


@struct.dataclass
class LayerCache:
    """One decoder layer's keys [B, KVH, d, S] and values [B, KVH, S, d], and the column
    where the call's tokens go."""

    keys: jax.Array
    values: jax.Array
    index: jax.Array

    def write(self, k: jax.Array, v: jax.Array) -> "LayerCache":
        """Stores new keys/values [B, t, KVH, d] at columns [index, index + t)."""
        keys = jax.lax.dynamic_update_slice(
            self.keys, k.transpose(0, 2, 3, 1).astype(self.keys.dtype), (0, 0, 0, self.index)
        )
        values = jax.lax.dynamic_update_slice(
            self.values, v.transpose(0, 2, 1, 3).astype(self.values.dtype), (0, 0, self.index, 0)
        )
        return self.replace(keys=keys, values=values)
