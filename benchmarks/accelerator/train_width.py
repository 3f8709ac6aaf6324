"""(b) The GRPO train step at a released model's width with its decoder cut to a few layers.

The model is `ModelConfig.preset(preset)` (Qwen2.5-VL-7B's hidden size, heads and MLP on an
accelerator) with `num_hidden_layers` set to each of two depths, run with the 7B recipe's
step (fp32 weights, bf16 compute, full remat over the scanned layers, chunked logprobs, PPO
loss, AdamW, frozen vision tower) on packed text rows of each length. Each (length, depth)
compiles ahead of time once: `memory_analysis()` of that program is the prediction, the
allocator's high-water mark over its steps the measurement; every program runs in a process
of its own, so that mark is its alone. Per-layer figures are the difference between the two
depths; the preset's full depth is extrapolated from them.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Callable

import jax

from benchmarks.accelerator.flops import peak_flops, train_step_flops
from benchmarks.accelerator.measure import GIB, compiled_memory, device_memory, matmul_rate, median, wall_times
from benchmarks.accelerator.packed_rows import packed_text_batch, segment_lengths
from benchmarks.accelerator.profile_summary import profile_call
from benchmarks.accelerator.recipe import StepRecipe, step_recipe
from benchmarks.accelerator.records import SectionLog
from benchmarks.accelerator.sizes import StepSizes, SuiteSizes, sizes_for
from benchmarks.accelerator.weights import random_params
from pyvision_jax.models import ModelConfig, param_logical_axes, params_sharding
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import make_train_step

MFU_TARGET = 0.45
EXTRAPOLATED = ("step_s", "peak_bytes", "predicted_bytes", "state_bytes")


def width_model(sizes: StepSizes, recipe: StepRecipe, depth: int) -> ModelConfig:
    return ModelConfig.preset(sizes.preset).replace(
        num_hidden_layers=depth, attention=recipe.attention(sizes.attention)
    )


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f} GiB"


def measure_step(
    config: ModelConfig, recipe: StepRecipe, sizes: StepSizes, length: int, profile: bool
) -> dict[str, Any]:
    """Compiles and runs the step of `config` on packed rows of `length` tokens."""
    mesh = make_mesh(1, -1, 1)
    rows = sizes.rows * mesh.size
    optimizer = make_optimizer(recipe.optimizer)
    before = device_memory()
    start = time.perf_counter()
    params = random_params(config, recipe.param_dtype, params_sharding(config, mesh))
    frozen = recipe.optimizer.frozen_prefixes
    state = jax.jit(lambda p: init_train_state(p, optimizer, 0, frozen), donate_argnums=0)(params)
    shardings = state_shardings(state, param_logical_axes(config), mesh)
    state = jax.block_until_ready(jax.device_put(state, shardings))
    del params
    init_s = time.perf_counter() - start
    batch = shard_batch(packed_text_batch(config, rows, length), mesh)
    step = make_train_step(config, recipe.step_config(), optimizer, mesh, shardings, donate=True)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    predicted = compiled_memory(compiled)
    holder = {"state": state}
    del state

    def one_step() -> dict:
        holder["state"], out = compiled(holder["state"], batch)
        return out

    times = wall_times(one_step, sizes.warmup, sizes.timed)
    out = jax.device_get(one_step())
    summary = profile_call(one_step) if profile else None
    after = device_memory()
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(holder["state"]))
    peak = after and after.get("peak_bytes_in_use")
    own_peak = peak if peak and (before is None or peak > before.get("peak_bytes_in_use", 0)) else None
    return {
        "layers": config.num_hidden_layers,
        "length": length,
        "rows": rows,
        "init_s": init_s,
        "compile_s": compile_s,
        "step_times_s": times,
        "step_s": median(times),
        "loss": float(out["loss"]),
        "updated": bool(out["updated"] > 0),
        "peak_bytes": own_peak,
        "peak_bytes_in_use": peak,
        "predicted": predicted,
        "predicted_bytes": predicted and predicted["total"],
        "state_bytes": state_bytes,
        "profile": summary,
    }


def rates(config: ModelConfig, run: dict[str, Any], peak: float | None, matmul: float) -> dict[str, Any]:
    """Real tokens/s, model FLOP/s and MFU (against the datasheet peak and the measured matmul)."""
    lengths = segment_lengths(run["length"]) * run["rows"]
    flops = train_step_flops(config, run["layers"], lengths)
    achieved = flops / run["step_s"]
    return {
        "real_tokens": sum(lengths),
        "tokens_per_s": sum(lengths) / run["step_s"],
        "model_flops": flops,
        "flops_per_s": achieved,
        "mfu": achieved / peak if peak else None,
        "fraction_of_matmul_rate": achieved / matmul,
        "mfu_target": MFU_TARGET,
        "meets_target": achieved / peak >= MFU_TARGET if peak else None,
    }


def profile_line(summary: dict[str, Any]) -> str:
    if "error" in summary:
        return f"no profile: {summary['error']}"
    shares = ", ".join(f"{name} {share:.0%}" for name, share in summary["category_share"].items())
    top = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in summary["top_ops"][:3])
    return f"{summary['op_seconds'] * 1e3:.0f} ms in {summary['ops']} ops: {shares}; top {top}"


def extrapolate(low: dict[str, Any], high: dict[str, Any], depth: int) -> dict[str, Any]:
    """Per-layer differences of the two depths and the figures at `depth` layers."""
    span = high["layers"] - low["layers"]
    out: dict[str, Any] = {"layers": depth}
    for key in EXTRAPOLATED:
        if low.get(key) is None or high.get(key) is None:
            out[key], out[f"{key}_per_layer"] = None, None
            continue
        per_layer = (high[key] - low[key]) / span
        out[f"{key}_per_layer"] = per_layer
        out[key] = high[key] + (depth - high["layers"]) * per_layer
    return out


def chip_figures(sizes: StepSizes) -> dict[str, Any]:
    """The device kind, its datasheet bf16 peak and the rate of a square matmul here."""
    kind = jax.local_devices()[0].device_kind
    matmul = matmul_rate(sizes.matmul, "float32" if jax.default_backend() == "cpu" else "bfloat16")
    return {"device_kind": kind, "datasheet_bf16_flops": peak_flops(kind), "matmul_flops": matmul}


def program_figures(kind: str, length: int, depth: int, profile: bool, chip: bool) -> dict[str, Any]:
    """`measure_step` of one (length, depth) of the `kind` sizes, and `chip_figures` after it
    when `chip`; run in a fresh process (`in_fresh_process`)."""
    sizes, recipe = sizes_for(kind).step, step_recipe()
    result = measure_step(width_model(sizes, recipe, depth), recipe, sizes, length, profile)
    return result | ({"chip": chip_figures(sizes)} if chip else {})


def in_fresh_process(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a new interpreter: the device allocator's high-water mark it reads
    is its program's alone, and the device memory is free again when it returns."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def run(sizes: SuiteSizes, log: SectionLog) -> None:
    """Each program in its own process; this one only gathers, extrapolates and records."""
    step_sizes, recipe = sizes.step, step_recipe()
    full_depth = ModelConfig.preset(step_sizes.preset).num_hidden_layers
    chip = None
    for length in step_sizes.lengths:
        runs = []
        for depth in step_sizes.depths:
            profile = length == step_sizes.lengths[-1] and depth == step_sizes.depths[-1]
            result = in_fresh_process(program_figures, sizes.kind, length, depth, profile, chip is None)
            if chip is None:
                chip = result.pop("chip")
                datasheet = chip["datasheet_bf16_flops"]
                datasheet = "n/a" if datasheet is None else f"{datasheet / 1e12:.0f}"
                log.record(
                    "chip",
                    chip,
                    f"{chip['device_kind']}: datasheet bf16 {datasheet} TFLOP/s, "
                    f"measured matmul {chip['matmul_flops'] / 1e12:.3g} TFLOP/s",
                )
            config = width_model(step_sizes, recipe, depth)
            result |= rates(config, result, chip["datasheet_bf16_flops"], chip["matmul_flops"])
            runs.append(result)
            mfu = "n/a" if result["mfu"] is None else f"{result['mfu']:.1%} (target {MFU_TARGET:.0%})"
            log.record(
                f"L={depth} T={length}",
                result,
                f"compile {result['compile_s']:.1f} s, step {result['step_s'] * 1e3:.0f} ms, "
                f"{result['tokens_per_s']:,.0f} tok/s, MFU {mfu}; peak {_gib(result['peak_bytes'])} vs "
                f"predicted {_gib(result['predicted_bytes'])}",
            )
            if result["profile"] is not None:
                log.record(f"profile L={depth} T={length}", result["profile"], profile_line(result["profile"]))
        full = extrapolate(*runs, full_depth) | {"length": length}
        config = width_model(step_sizes, recipe, full_depth)
        if full["step_s"]:
            full |= rates(
                config, {**full, "rows": runs[-1]["rows"]}, chip["datasheet_bf16_flops"], chip["matmul_flops"]
            )
        mfu = "n/a" if full.get("mfu") is None else f"{full['mfu']:.1%} (target {MFU_TARGET:.0%})"
        log.record(
            f"L={full_depth} T={length} (extrapolated)",
            full,
            f"per layer {(full['step_s_per_layer'] or 0) * 1e3:.1f} ms, {_gib(full['peak_bytes_per_layer'])};"
            f" {full_depth} layers: step {(full['step_s'] or 0) * 1e3:.0f} ms, MFU {mfu}, peak "
            f"{_gib(full['peak_bytes'])} vs predicted {_gib(full['predicted_bytes'])} (one device, unsharded)",
        )
