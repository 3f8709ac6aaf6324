"""The engine's decode step against its roofline, measured on this machine in the same run.

For each model (the packaged small model's size, and a 7B-width slice: the 7B's hidden,
MLP, head and vocabulary sizes with ``--slice-layers`` decoder layers) and each rows x cache
length, the compiled decode dispatch the engine runs (``rollout.decode_loop.decode_steps``,
``--steps`` steps a dispatch, every row live) is timed per step, best of ``--repeats``, and
compared with its roofline:

  roofline = max(bytes read / bandwidth, FLOPs / matmul rate)

bytes: the decoder's weights (the embedding only for the rows' tokens) and every layer's keys
and values over the whole cache; FLOPs: 2 per weight per row plus the attention's
4 x heads x head_dim x cache length per row and layer. The bandwidth (a reduction over a
--bandwidth-mib array), the matmul rate (square matmuls in the compute dtype) and the
dispatch floor (a jitted scalar add, called and waited for) are measured first. A step can
be no faster than max(roofline, dispatch floor / steps); the ratio printed is the step's
time over the roofline.

  python -m benchmarks.engine_roofline [--models small,7b-slice] [--rows 1,8,32,64]
      [--caches 512,1024] [--steps 8] [--repeats 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from benchmarks.accelerator.measure import wall_times
from pyvision_jax.models import KVCache, ModelConfig, unstack_layers
from pyvision_jax.models.qwen2_5_vl import init_params
from pyvision_jax.rollout.decode_loop import decode_steps
from pyvision_jax.rollout.sampling import SamplingArrays


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` timed calls (each waited for), after one untimed call."""
    return min(wall_times(run, warmup=1, count=repeats))


def measure_bandwidth(mib: int, repeats: int) -> float:
    """Bytes per second a compiled reduction streams from memory."""
    array = jnp.ones((mib << 18,), jnp.float32)
    total = jax.jit(jnp.sum)
    return array.nbytes / best_seconds(lambda: total(array), repeats)


def measure_matmul_rate(dtype: Any, size: int, repeats: int) -> float:
    """FLOP/s of a square matmul in `dtype`."""
    a = jnp.ones((size, size), dtype)
    product = jax.jit(jnp.matmul)
    return 2 * size**3 / best_seconds(lambda: product(a, a), repeats)


def measure_dispatch_floor(calls: int = 200) -> float:
    """Seconds to call a compiled scalar add and wait for it: the cost of any dispatch."""
    add = jax.jit(lambda x: x + 1)
    x = jnp.zeros((), jnp.int32)
    add(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(calls):
        x = add(x)
    x.block_until_ready()
    return (time.perf_counter() - start) / calls


def model_config(name: str, slice_layers: int) -> ModelConfig:
    if name == "small":
        return ModelConfig.preset("small")
    if name == "7b-slice":
        # the vision tower does not take part in decoding: one block keeps its weights small
        seven = ModelConfig.preset("7b")
        vision = dict(depth=1, fullatt_block_indexes=(0,))
        return seven.replace(num_hidden_layers=slice_layers, vision=vision)
    raise SystemExit(f"--models: unknown model {name!r}; choose small or 7b-slice")


def text_weight_bytes(params: dict) -> tuple[int, int]:
    """(bytes of the decoder's weights without the embedding table, bytes of one embedding row)."""
    text = {k: v for k, v in params.items() if k != "visual"}
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(text))
    table = params["model"]["embed_tokens"]["embedding"]
    return total - table.nbytes, table.nbytes // table.shape[0]


def step_cost(config: ModelConfig, params: dict, rows: int, cache_length: int, cache_itemsize: int) -> tuple[int, int]:
    """(bytes read, FLOPs) of one decode step over `rows` rows and the whole cache."""
    weights, embedding_row = text_weight_bytes(params)
    weight_count = sum(leaf.size for k, v in params.items() if k != "visual" for leaf in jax.tree.leaves(v))
    weight_count -= params["model"]["embed_tokens"]["embedding"].size
    kv_elements = 2 * config.num_hidden_layers * rows * config.num_key_value_heads * cache_length * config.head_dim
    read = weights + rows * embedding_row + kv_elements * cache_itemsize
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * cache_length * rows
    return read, 2 * weight_count * rows + attention


def decode_step_seconds(
    config: ModelConfig, params: dict, dtype: Any, rows: int, cache_length: int, steps: int, repeats: int
) -> tuple[float, int]:
    """(Per-step seconds of the engine's compiled decode dispatch, every row live throughout;
    executables compiled by the timed calls, after the first call compiled.)"""
    run = jax.jit(partial(decode_steps, config, jnp.dtype(dtype).name, steps), donate_argnums=(1,))
    start_column = cache_length - steps - 1
    cache = KVCache.init(config, rows, cache_length, dtype)
    cache = cache.replace(valid=cache.valid.at[:, :start_column].set(True), index=jnp.asarray(start_column, jnp.int32))
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), rows))
    fixed = dict(
        tokens=jnp.ones(rows, jnp.int32),
        positions=jnp.full(rows, start_column, jnp.int32),
        live=jnp.ones(rows, bool),
        counts=jnp.zeros(rows, jnp.int32),
        limits=jnp.full(rows, 1 << 30, jnp.int32),
        keys=keys,
        stop_mask=jnp.zeros(config.vocab_size, bool),
        settings=SamplingArrays.create(1.0, 0, 1.0),
    )
    state = {"cache": cache}

    def dispatch() -> Any:
        out = run(params, state["cache"], **fixed)
        # every dispatch starts from the same column: the cache's contents do not change the cost
        state["cache"] = out[0].replace(index=jnp.asarray(start_column, jnp.int32))
        return out

    dispatch()[4].block_until_ready()  # compiles
    compiled = run._cache_size()
    seconds = best_seconds(dispatch, repeats)
    steps_run = int(dispatch()[4])
    assert steps_run == steps, f"the dispatch ran {steps_run} of {steps} steps"
    return seconds / steps, run._cache_size() - compiled


@dataclasses.dataclass(frozen=True)
class MachineLimits:
    bandwidth: float
    """Bytes per second."""
    matmul_rate: float
    """FLOP/s in the compute dtype."""
    dispatch_floor: float
    """Seconds."""


def measure_limits(dtype: Any, bandwidth_mib: int, matmul_size: int, repeats: int) -> MachineLimits:
    return MachineLimits(
        measure_bandwidth(bandwidth_mib, repeats),
        measure_matmul_rate(dtype, matmul_size, repeats),
        measure_dispatch_floor(),
    )


def roofline_point(
    config: ModelConfig,
    params: dict,
    dtype: Any,
    rows: int,
    cache_length: int,
    steps: int,
    repeats: int,
    limits: MachineLimits,
) -> dict:
    """One rows x cache length: the decode step's time, its roofline and their ratio."""
    dtype = jnp.dtype(dtype)
    read, flops = step_cost(config, params, rows, cache_length, dtype.itemsize)
    memory_s, compute_s = read / limits.bandwidth, flops / limits.matmul_rate
    roofline = max(memory_s, compute_s, limits.dispatch_floor / steps)
    bound = "memory" if roofline == memory_s else "compute" if roofline == compute_s else "dispatch"
    layered = unstack_layers(params)  # the form the engine decodes with
    seconds, compiles = decode_step_seconds(config, layered, dtype, rows, cache_length, steps, repeats)
    return dict(
        rows=rows,
        cache=cache_length,
        step_s=seconds,
        roofline_s=roofline,
        bytes=read,
        flops=flops,
        bound=bound,
        ratio=seconds / roofline,
        compiles_timed=compiles,
    )


def run(args: argparse.Namespace) -> dict:
    dtype = jnp.dtype(args.dtype)
    print(f"devices: {jax.devices()}")
    limits = measure_limits(dtype, args.bandwidth_mib, args.matmul_size, args.repeats)
    print(
        f"bandwidth {limits.bandwidth / 1e9:.1f} GB/s, {dtype.name} matmul {limits.matmul_rate / 1e9:.1f} GFLOP/s, "
        f"dispatch floor {limits.dispatch_floor * 1e6:.0f} us"
    )
    rows_list = [int(r) for r in args.rows.split(",")]
    caches = [int(c) for c in args.caches.split(",")]
    results: list[dict] = []
    print("| model | rows | cache | ms/step | roofline ms | bound | ratio | compiles timed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        config = model_config(name, args.slice_layers)
        params = init_params(config, dtype=dtype)
        for cache_length in caches:
            for rows in rows_list:
                point = roofline_point(config, params, dtype, rows, cache_length, args.steps, args.repeats, limits)
                print(
                    f"| {name} | {rows} | {cache_length} | {point['step_s'] * 1e3:.3f} | "
                    f"{point['roofline_s'] * 1e3:.3f} | {point['bound']} | {point['ratio']:.2f}x | "
                    f"{point['compiles_timed']} |",
                    flush=True,
                )
                results.append(dict(model=name, **point))
        del params
    summary = dict(
        devices=[str(d) for d in jax.devices()],
        dtype=dtype.name,
        bandwidth_bytes_s=limits.bandwidth,
        matmul_flops_s=limits.matmul_rate,
        dispatch_floor_s=limits.dispatch_floor,
        steps_per_dispatch=args.steps,
        decode=results,
    )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="small,7b-slice")
    parser.add_argument("--slice-layers", type=int, default=2)
    parser.add_argument("--rows", default="1,8,32,64")
    parser.add_argument("--caches", default="512,1024")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--bandwidth-mib", type=int, default=256)
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument("--out", default="")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
