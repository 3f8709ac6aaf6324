"""(d) The JAX engine's decoding: tokens/s of `JaxEngine.generate` with every slot of a full
batch busy, greedy, a fixed number of new tokens (no stop token), on the shipped small
model and on a slice (a few decoder layers) of a released model's width.

One call generates `new_tokens` per request, prefill included; a call with one new token is
the prefill alone, so decode tokens/s = batch x (new_tokens - 1) / (generate - prefill).
Each figure is the best of `repeats` calls after two warm-up calls (compilation).

Then the engine's decode step against its roofline (benchmarks/engine_roofline.py: the step's
time over the larger of the bytes it reads over the measured bandwidth and its FLOPs over the
measured matmul rate) at `roofline_rows` rows and each of `roofline_caches`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.accelerator.parity import SMALL_SFT
from benchmarks.accelerator.records import SectionLog
from benchmarks.accelerator.sizes import DecodeSizes, SuiteSizes
from benchmarks.accelerator.weights import random_params
from benchmarks.engine_roofline import MachineLimits, measure_limits, roofline_point
from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.convert import load_hf
from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.jax_engine import JaxEngine


def best_call(
    engine: JaxEngine, requests: list[GenerationRequest], sampling: SamplingParams, repeats: int
) -> tuple[float, float]:
    """(seconds of the first call, best seconds of `repeats` calls after a second one: the
    first compiles prefill and decode, the second the cache moves a call starts with)."""
    start = time.perf_counter()
    engine.generate(requests, sampling)
    first = time.perf_counter() - start
    engine.generate(requests, sampling)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        results = engine.generate(requests, sampling)
        best = min(best, time.perf_counter() - start)
    if any(len(r.token_ids) != sampling.max_new_tokens for r in results):
        raise RuntimeError("a request ended before its token limit (the engine should have no stop token)")
    return first, best


def decode_rates(config: ModelConfig, params: Any, sizes: DecodeSizes) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    engine = JaxEngine(
        config,
        params,
        None,
        max_batch=sizes.batch,
        length_buckets=(sizes.prompt, sizes.prompt + sizes.new_tokens),
        decode_chunk=sizes.decode_chunk,
        min_cache_length=sizes.prompt + sizes.new_tokens,
        compute_dtype=sizes.dtype,
        cache_dtype=sizes.dtype,
        eos_token_ids=(),
    )
    requests = [
        GenerationRequest(f"r{i}", tuple(int(t) for t in rng.integers(0, config.vision_start_token_id, sizes.prompt)))
        for i in range(sizes.batch)
    ]
    first, generate_s = best_call(
        engine, requests, SamplingParams(temperature=0.0, max_new_tokens=sizes.new_tokens), sizes.repeats
    )
    _, prefill_s = best_call(engine, requests, SamplingParams(temperature=0.0, max_new_tokens=1), sizes.repeats)
    decoded = sizes.batch * (sizes.new_tokens - 1)
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "batch": sizes.batch,
        "prompt": sizes.prompt,
        "new_tokens": sizes.new_tokens,
        "dtype": sizes.dtype,
        "first_call_s": first,
        "generate_s": generate_s,
        "prefill_s": prefill_s,
        "tokens_per_s": sizes.batch * sizes.new_tokens / generate_s,
        "decode_tokens_per_s": decoded / max(generate_s - prefill_s, 1e-9),
        "compiles": dict(engine.compile_counts),
    }


def roofline_ratios(config: ModelConfig, params: Any, sizes: DecodeSizes, limits: MachineLimits) -> dict[str, Any]:
    points = [
        roofline_point(
            config, params, sizes.dtype, sizes.roofline_rows, cache, sizes.decode_chunk, sizes.repeats, limits
        )
        for cache in sizes.roofline_caches
    ]
    return {
        "bandwidth_bytes_s": limits.bandwidth,
        "matmul_flops_s": limits.matmul_rate,
        "dispatch_floor_s": limits.dispatch_floor,
        "points": points,
    }


def run(sizes: SuiteSizes, log: SectionLog) -> None:
    dec = sizes.decode
    limits = measure_limits(dec.dtype, dec.bandwidth_mib, dec.matmul, max(dec.repeats, 2))
    wide = ModelConfig.preset(dec.slice_preset).replace(num_hidden_layers=dec.slice_depth)
    models = (
        ("small", lambda: load_hf(SMALL_SFT, dtype=dec.dtype, progress=False)),
        (f"{dec.slice_preset} width, {dec.slice_depth} layers", lambda: (wide, random_params(wide, dec.dtype))),
    )
    for name, load in models:
        config, params = load()
        result = decode_rates(config, params, dec)
        result["roofline"] = roofline_ratios(config, params, dec, limits)
        del params
        log.record(
            name,
            result,
            f"batch {dec.batch}, prompt {dec.prompt} + {dec.new_tokens} new: "
            f"{result['tokens_per_s']:,.0f} tok/s with prefill, {result['decode_tokens_per_s']:,.0f} decode "
            f"tok/s (first call {result['first_call_s']:.1f} s); decode step / roofline "
            + ", ".join(
                f"{p['ratio']:.2f}x at {p['rows']} rows, cache {p['cache']}" for p in result["roofline"]["points"]
            ),
        )
