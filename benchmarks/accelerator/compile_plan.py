"""Compile times of the suite's device-size programs, measured by compiling them for the CPU
(abstract inputs: nothing is allocated), for the H200 sizing in docs/accelerator_suite.md.

    python -m benchmarks.accelerator.compile_plan [--sizes gpu] [--only step|attention]

Each train step of the "gpu" sizes (every depth and row length) and each attention program
is lowered and compiled by XLA:CPU; printed: lower and compile seconds and the program's
memory_analysis(). Kernels that exist only on accelerators (cuDNN, splash) compile as the
blockwise kernel here.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from benchmarks.accelerator.attention_kernels import forward_backward
from benchmarks.accelerator.measure import GIB, compiled_memory
from benchmarks.accelerator.packed_rows import packed_text_batch
from benchmarks.accelerator.recipe import step_recipe
from benchmarks.accelerator.sizes import SuiteSizes, sizes_for
from benchmarks.accelerator.train_width import width_model
from pyvision_jax.models import param_logical_axes, param_shapes
from pyvision_jax.train.batch_placement import batch_shardings
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import make_train_step

CPU_STAND_INS = {"cudnn": "blockwise", "splash": "blockwise"}


def with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def timed_compile(lower, *args) -> tuple[float, float, dict | None]:
    """(lower seconds, compile seconds, memory_analysis) of `lower(*args)`."""
    start = time.perf_counter()
    lowered = lower(*args)
    lowered_s = time.perf_counter() - start
    compiled = lowered.compile()
    return lowered_s, time.perf_counter() - start - lowered_s, compiled_memory(compiled)


def step_programs(sizes: SuiteSizes) -> None:
    recipe = step_recipe()
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = make_optimizer(recipe.optimizer)
    frozen = recipe.optimizer.frozen_prefixes
    attention = CPU_STAND_INS.get(sizes.step.attention, sizes.step.attention)
    for length in sizes.step.lengths:
        for depth in sizes.step.depths:
            config = width_model(sizes.step, recipe, depth).replace(attention=recipe.attention(attention))
            params = jax.tree.map(
                lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(recipe.param_dtype)), param_shapes(config)
            )
            state = jax.eval_shape(lambda p: init_train_state(p, optimizer, 0, frozen), params)
            shardings = state_shardings(state, param_logical_axes(config), mesh)
            batch = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), packed_text_batch(config, sizes.step.rows, length)
            )
            step = make_train_step(config, recipe.step_config(), optimizer, mesh, shardings, donate=True)
            lowered_s, compile_s, memory = timed_compile(
                step.lower, with_shardings(state, shardings), with_shardings(batch, batch_shardings(batch, mesh))
            )
            total = "n/a" if memory is None else f"{memory['total'] / GIB:.2f} GiB"
            print(
                f"step L={depth} T={length} ({attention}): lower {lowered_s:.1f} s, compile {compile_s:.1f} s, "
                f"memory_analysis total {total}",
                flush=True,
            )


def attention_programs(sizes: SuiteSizes) -> None:
    att = sizes.attention
    for length in att.lengths:
        for implementation in att.implementations:
            stand_in = CPU_STAND_INS.get(implementation, implementation)
            q, kv = ((1, length, heads, att.head_dim) for heads in (att.heads, att.kv_heads))
            arrays = [jax.ShapeDtypeStruct(shape, jnp.bfloat16) for shape in (q, kv, kv, q)]
            arrays.append(jax.ShapeDtypeStruct((1, length), jnp.int32))
            step = forward_backward(stand_in, att.head_dim**-0.5)
            lowered_s, compile_s, memory = timed_compile(step.lower, *arrays)
            temps = "n/a" if memory is None else f"{memory['temps'] / GIB:.3f} GiB"
            print(
                f"attention {implementation} T={length} (as {stand_in}): lower {lowered_s:.1f} s, "
                f"compile {compile_s:.1f} s, temps {temps}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="gpu")
    parser.add_argument("--only", choices=("step", "attention"), default=None)
    args = parser.parse_args()
    sizes = sizes_for(args.sizes)
    if args.only in (None, "attention"):
        attention_programs(sizes)
    if args.only in (None, "step"):
        step_programs(sizes)


if __name__ == "__main__":
    main()
