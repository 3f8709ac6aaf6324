"""Timing and memory readings that work on every backend (CPU devices report no memory
statistics: their readings are None)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

GIB = 2**30


def device_memory(device: jax.Device | None = None) -> dict[str, int] | None:
    """The allocator's bytes_in_use, peak_bytes_in_use and bytes_limit, or None where the
    backend keeps no statistics."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    if not stats:
        return None
    return {key: int(stats[key]) for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if key in stats}


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    """memory_analysis() of a compiled program: its arguments, outputs, temporaries, the
    donated (aliased) part and the total alive at its peak, or None when unavailable."""
    try:
        analysis = compiled.memory_analysis()
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    if analysis is None:
        return None
    out = {
        "arguments": analysis.argument_size_in_bytes,
        "outputs": analysis.output_size_in_bytes,
        "temps": analysis.temp_size_in_bytes,
        "aliased": analysis.alias_size_in_bytes,
    }
    out["total"] = out["arguments"] + out["outputs"] + out["temps"] - out["aliased"]
    return {key: int(value) for key, value in out.items()}


def wall_times(run: Callable[[], Any], warmup: int, count: int) -> list[float]:
    """Seconds of `count` calls of `run` after `warmup` calls, each until its result is ready."""
    for _ in range(warmup):
        jax.block_until_ready(run())
    times = []
    for _ in range(count):
        start = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def matmul_rate(size: int, dtype: str) -> float:
    """FLOP/s of a square `size` matmul in `dtype` on random data (median of 5 after 2 warm-ups):
    the rate the chip reaches here, next to its datasheet peak."""
    a, b = (jax.random.normal(jax.random.key(seed), (size, size), jnp.dtype(dtype)) for seed in (0, 1))
    product = jax.jit(jnp.matmul)
    return 2.0 * size**3 / median(wall_times(lambda: product(a, b), 2, 5))


def relative_error(actual: Any, expected: Any) -> float:
    """||actual - expected|| / ||expected|| in float32."""
    actual, expected = jnp.asarray(actual, jnp.float32), jnp.asarray(expected, jnp.float32)
    return float(jnp.linalg.norm(actual - expected) / jnp.maximum(jnp.linalg.norm(expected), 1e-30))
