"""Compiling, before a ``JaxEngine`` serves, every shape it can dispatch.

The engine's jitted functions see a fixed set of shapes (``jax_engine`` module docstring):
for each cache length the engine can use (a length bucket plus ``decode_chunk``, at least
``min_cache_length``), prefill of every (prefill batch size, length bucket) that fits the
cache, extension of every (prefill batch size, extension bucket), decode of every decode
batch size at every live span (``decode_loop``: the cache lengths up to the cache's), the
compaction, row swaps of each pair count, and growth to each larger cache length.
Blocks with images add a vision layout to the prefill and extension inputs, at the engine's
vision floors per (kind, batch size) (``vision_floors``: fixed up front from the image tokens
a row is expected to hold; a block with more images raises its floor and compiles once more).

``warm_up`` calls the engine's own jitted functions (so their dispatch caches hold the
executables) on dummy inputs: padding rows whose targets lie outside the cache (dropped),
decode rows that are not live (the loop runs no step), on caches of its own; the engine's
cache, slots and counters of calls and tokens are left as they were.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.sampling import SamplingArrays


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What ``warm_up`` compiled: executables added, calls made and wall seconds."""

    compiles: int
    calls: int
    seconds: float


def cache_lengths(length_buckets: tuple[int, ...], decode_chunk: int, min_length: int) -> list[int]:
    """Every cache length the engine can use: the buckets plus `decode_chunk`, from `min_length` on."""
    return [bucket + decode_chunk for bucket in length_buckets if bucket + decode_chunk >= min_length]


def _block_inputs(config: ModelConfig, batch: int, length: int, image: bool) -> dict:
    """Processor-style inputs of a block: one real token per row (the last), and with
    `image` one small image (a single merge unit) ending row 0 (a block of 3 tokens or more)."""
    ids = np.full((batch, length), config.pad_token_id, np.int32)
    mask = np.zeros((batch, length), bool)
    mask[:, -1] = True
    inputs = {"input_ids": ids, "attention_mask": mask}
    if image:
        merge = config.vision.spatial_merge_size
        ids[0, -3:] = (config.vision_start_token_id, config.image_token_id, config.vision_end_token_id)
        mask[0, -3:] = True
        inputs["pixel_values"] = np.zeros((merge * merge, config.vision.patch_dim), np.float32)
        inputs["image_grid_thw"] = np.array([[1, merge, merge]], np.int64)
    return inputs


def warm_up(engine: Any, images: bool) -> WarmUp:
    """Runs each of `engine`'s jitted functions once at every shape it can dispatch (with
    `images`, the prefill and extension also with a vision layout at the engine's floors).
    `engine` is a ``JaxEngine``; its state is left as it was."""
    began, compiled = time.perf_counter(), engine.compiles
    config, kv, params = engine.config, engine._kv, engine._params
    settings = SamplingArrays.create(1.0, 0, 1.0)
    stop_mask = jnp.zeros(config.vocab_size, bool)
    outside = lambda batch: jnp.full(batch, engine.max_batch, jnp.int32)  # targets: dropped
    keys = lambda batch: jnp.zeros((batch, 2), jnp.uint32)
    floors = dict(engine._vision.floors)
    lengths = cache_lengths(engine.length_buckets, engine.decode_chunk, kv.min_length)
    calls = 0
    for length in lengths:
        cache = kv.empty(length)
        for image in (False, True) if images else (False,):
            for batch in engine.prefill_batches:
                for bucket in (b for b in engine.length_buckets if b <= length and (b >= 3 or not image)):
                    inputs, _ = engine._vision.prepare(("prefill", batch), _block_inputs(config, batch, bucket, image))
                    start = jnp.asarray(length - bucket, jnp.int32)
                    cache, *_ = engine._prefill(params, cache, inputs, outside(batch), start, keys(batch), settings)
                    calls += 1
                for bucket in (b for b in engine.extension_buckets if b >= 3 or not image):
                    inputs, _ = engine._vision.prepare(("extend", batch), _block_inputs(config, batch, bucket, image))
                    keep = jnp.zeros(batch, jnp.int32)
                    cache, *_ = engine._extend(params, cache, inputs, outside(batch), keep, keys(batch), settings)
                    calls += 1
        spans = [b + engine.decode_chunk for b in engine.length_buckets if b + engine.decode_chunk <= length]
        for rows in engine.decode_batches:
            zeros = jnp.zeros(rows, jnp.int32)
            for span in spans if engine.live_span else [0]:
                cache, *_ = engine._decode(
                    params,
                    cache,
                    zeros,
                    zeros,
                    jnp.zeros(rows, bool),
                    zeros,
                    zeros,
                    keys(rows),
                    stop_mask,
                    settings,
                    span=span,
                )
                calls += 1
        cache = kv._compact(cache, jnp.zeros(engine.max_batch, jnp.int32), jnp.asarray(0, jnp.int32))
        for pairs in kv.swap_sizes:
            rows = jnp.zeros(2 * pairs, jnp.int32)
            cache = kv._swap(cache, rows, rows)
            calls += 1
        for larger in (n for n in lengths if n > length):
            kv._grow(cache, larger)
            calls += 1
        cache.valid.block_until_ready()
        calls += 1
    engine._vision.floors = floors
    return WarmUp(engine.compiles - compiled, calls, time.perf_counter() - began)
