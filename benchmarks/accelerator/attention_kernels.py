"""(c) Training attention kernels: forward + backward time and memory of each implementation
(models/attention.py) on one packed causal row, and its output and gradients against the
first implementation's (blockwise).

Shapes: the model's heads (7B: 28 query heads, 4 kv heads, head_dim 128) in bf16, the row
packed like the train step's (packed_rows.py). Memory: the compiled program's temporaries
(`memory_analysis()`) and the allocator's high-water mark while it ran, where the backend
keeps one. TFLOP/s use the causal pairs within the segments (flops.py).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.accelerator.flops import attention_flops, causal_pairs
from benchmarks.accelerator.measure import GIB, compiled_memory, device_memory, median, relative_error, wall_times
from benchmarks.accelerator.packed_rows import segment_ids, segment_lengths
from benchmarks.accelerator.records import SectionLog
from benchmarks.accelerator.sizes import AttentionSizes, SuiteSizes
from pyvision_jax.models.attention import AttentionConfig, attention

BLOCK = 512
"""Block sizes of blockwise and splash (the 7B config's)."""
BF16_TOLERANCE = 2e-2
"""Relative error two bf16 attention kernels may differ by (outputs and gradients)."""


def kernel_inputs(sizes: AttentionSizes, length: int) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(length), 4)
    shape = lambda heads: (1, length, heads, sizes.head_dim)  # noqa: E731
    q = jax.random.normal(keys[0], shape(sizes.heads), jnp.bfloat16)
    k, v = (jax.random.normal(key, shape(sizes.kv_heads), jnp.bfloat16) for key in keys[1:3])
    weights = jax.random.normal(keys[3], shape(sizes.heads), jnp.bfloat16)
    return q, k, v, weights, jnp.asarray(segment_ids(length)[None])


def forward_backward(implementation: str, scale: float):
    config = AttentionConfig(implementation, BLOCK, BLOCK)

    def loss(q, k, v, weights, segments):
        out = attention(q, k, v, segments, segments, causal=True, scale=scale, config=config)
        return jnp.sum(out.astype(jnp.float32) * weights.astype(jnp.float32)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def measure(implementation: str, sizes: AttentionSizes, arrays: tuple[jax.Array, ...]) -> tuple[dict, Any]:
    step = forward_backward(implementation, sizes.head_dim**-0.5)
    start = time.perf_counter()
    compiled = step.lower(*arrays).compile()
    compile_s = time.perf_counter() - start
    before = device_memory()
    times = wall_times(lambda: compiled(*arrays), 1, sizes.timed)
    (_, out), grads = compiled(*arrays)
    after = device_memory()
    peak = after and after.get("peak_bytes_in_use")
    grown = peak if peak and (before is None or peak > before.get("peak_bytes_in_use", 0)) else None
    memory = compiled_memory(compiled)
    length = arrays[0].shape[1]
    flops = attention_flops(sizes.heads, sizes.head_dim, causal_pairs(segment_lengths(length)))
    result = {
        "implementation": implementation,
        "length": length,
        "compile_s": compile_s,
        "times_s": times,
        "time_s": median(times),
        "tflops_per_s": flops / median(times) / 1e12,
        "temp_bytes": memory and memory["temps"],
        "peak_bytes": grown,
    }
    return result, (out, *grads)


def run(sizes: SuiteSizes, log: SectionLog) -> None:
    att = sizes.attention
    for length in att.lengths:
        arrays = kernel_inputs(att, length)
        reference = None
        for implementation in att.implementations:
            try:
                result, values = measure(implementation, att, arrays)
            except Exception as error:  # noqa: BLE001 (one kernel failing must not hide the others)
                message = "".join(str(error).splitlines()[:1])[:300]
                log.record(f"{implementation} T={length}", {"error": message}, f"failed: {message}")
                continue
            if reference is None:
                reference = values
            errors = {name: relative_error(a, b) for name, a, b in zip(("out", "dq", "dk", "dv"), values, reference)}
            result |= {
                "relative_error": errors,
                "matches_reference": max(errors.values()) < BF16_TOLERANCE,
                "reference": att.implementations[0],
            }
            temp = "n/a" if result["temp_bytes"] is None else f"{result['temp_bytes'] / GIB:.3f} GiB"
            log.record(
                f"{implementation} T={length}",
                result,
                f"fwd+bwd {result['time_s'] * 1e3:.2f} ms ({result['tflops_per_s']:.3g} TFLOP/s), "
                f"temps {temp}, max rel err vs {att.implementations[0]} {max(errors.values()):.1e} "
                f"(matches: {result['matches_reference']})",
            )
        del arrays, reference
