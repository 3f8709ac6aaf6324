"""Per-device memory of the real 7B train step, from an ahead-of-time compile on fake CPU devices.

    python -m benchmarks.memory_7b --config configs/pyvision_image_7b.py --devices 8 --tokens 32768
    python -m benchmarks.memory_7b --config configs/pyvision_image_7b_v5p8.py --devices 4 --tokens 32768

The step (`train.step.make_train_step`: vision tower, scanned decoder, chunked logprobs, PPO
loss, AdamW) is lowered for abstract inputs (`jax.ShapeDtypeStruct` with their shardings:
nothing is allocated) on the config's mesh over `--devices` host devices, compiled by XLA:CPU,
and `memory_analysis()` of the compiled per-device program gives the bytes of its arguments
(train state + batch), outputs, temporaries and the donated (aliased) part. The attention
kernel is the config's unless it only exists on accelerators (cuDNN, splash): then the
pure-JAX blockwise kernel, which holds the same O(T x block) working set, stands in.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from pyvision_jax import wiring
from pyvision_jax.models import ModelConfig, param_logical_axes, param_shapes
from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.models.vision import VisionLayout, window_units
from pyvision_jax.train.batch_placement import batch_shardings
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, TrainBatch, make_train_step

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "pyvision_image_7b.py"))
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices (the mesh's size)")
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per packed row")
    parser.add_argument(
        "--image-tokens",
        type=int,
        default=8192,
        help="merged image tokens per row (x4 patches through the vision tower)",
    )
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--remat", default=None, help="override model.remat")
    parser.add_argument("--preset", default=None, help="override model.preset (e.g. tiny, for a smoke run)")
    parser.add_argument(
        "--param-dtype",
        default=None,
        help="override model.param_dtype (bfloat16: the weights and AdamW moments in bf16)",
    )
    return parser.parse_args()


CPU_ATTENTION = {"cudnn": "blockwise", "splash": "blockwise"}
NO_CPU_HOISTING = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}
"""XLA:CPU computes bf16 matmuls in fp32, so the backward layer loop converts each layer's
saved bf16 activations to fp32 before use; loop-invariant code motion then hoists that
convert out of the loop, converting the whole [layers, ...] stack at once, an fp32 copy of
every saved activation alive through the backward pass. GPUs and TPUs consume bf16 directly
(there is no convert to hoist), so the figure that stands for an accelerator compiles
without that pass; both are printed."""
GIB = 2**30


def load_config(path: str):
    namespace: dict = {}
    exec(compile(Path(path).read_text(), path, "exec"), namespace)  # noqa: S102 (a config file of this repo)
    return namespace["get_config"]()


def abstract_batch(model: ModelConfig, rows: int, tokens: int, image_tokens: int, micro_batches: int) -> TrainBatch:
    """ShapeDtypeStructs of a packed batch: `rows` rows of `tokens` tokens per micro-batch,
    `image_tokens` merged image tokens per row."""
    vision = model.vision
    window_len = window_units(vision) ** 2 * vision.merge_unit
    slots = -(-rows * image_tokens * vision.merge_unit // window_len) * window_len
    shape = lambda *dims, dtype=jnp.int32: jax.ShapeDtypeStruct((micro_batches, *dims), dtype)  # noqa: E731
    layout = (
        VisionLayout(
            patch_index=shape(slots),
            slot_valid=shape(slots, dtype=bool),
            positions=shape(slots, 2),
            frame_id=shape(slots),
            merged_index=shape(rows * image_tokens),
        )
        if image_tokens
        else None
    )
    return TrainBatch(
        input_ids=shape(rows, tokens),
        attention_mask=shape(rows, tokens, dtype=bool),
        positions=shape(3, rows, tokens),
        loss_mask=shape(rows, tokens, dtype=bool),
        behaviour_logprobs=shape(rows, tokens, dtype=jnp.float32),
        advantages=shape(rows, 8, dtype=jnp.float32),
        pixel_values=shape(slots, vision.patch_dim, dtype=jnp.float32) if image_tokens else None,
        layout=layout,
        segment_ids=shape(rows, tokens),
    )


def with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def main() -> None:
    args = parse_args()
    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices)  # before the first device is made
    c = load_config(args.config)
    attention = AttentionConfig(
        CPU_ATTENTION.get(c.model.attention, c.model.attention), c.model.attention_block_q, c.model.attention_block_kv
    )
    model = ModelConfig.preset(args.preset or c.model.preset).replace(attention=attention)
    mesh = make_mesh(c.train.mesh_data, c.train.mesh_fsdp, c.train.mesh_tensor)
    frozen = ("visual",) if c.train.freeze_vision else ()
    step_config = StepConfig(
        loss=wiring.loss_config(c.rl),
        temperature=c.rollout.temperature,
        logprob_chunk=c.train.logprob_chunk,
        old_logprobs=c.train.old_logprobs,
        compute_dtype=c.model.compute_dtype,
        frozen_prefixes=frozen,
        remat=args.remat or c.model.remat,
    )
    optimizer = make_optimizer(wiring.optimizer_config(c.train, frozen))
    param_dtype = args.param_dtype or c.model.param_dtype
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(param_dtype)), param_shapes(model))
    state = jax.eval_shape(lambda p: init_train_state(p, optimizer, 0, frozen), params)
    shardings = state_shardings(state, param_logical_axes(model), mesh)
    batch = abstract_batch(model, c.train.micro_batch, args.tokens, args.image_tokens, args.micro_batches)
    step = make_train_step(model, step_config, optimizer, mesh, shardings, donate=True)
    print(
        f"config={Path(args.config).name} devices={args.devices} mesh={dict(mesh.shape)} "
        f"rows/micro-batch={c.train.micro_batch} tokens/row={args.tokens} image tokens/row={args.image_tokens} "
        f"micro-batches={args.micro_batches} remat={step_config.remat} attention={attention.implementation} "
        f"params={param_dtype} compute={c.model.compute_dtype}",
        flush=True,
    )
    start = time.perf_counter()
    lowered = step.lower(with_shardings(state, shardings), with_shardings(batch, batch_shardings(batch, mesh)))
    lower_s = time.perf_counter() - start
    for label, options in (
        ("as XLA:CPU compiles it", {}),
        ("without XLA:CPU's bf16 convert hoisting", NO_CPU_HOISTING),
    ):
        start = time.perf_counter()
        compiled = lowered.compile(compiler_options=options)
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        arguments, outputs = memory.argument_size_in_bytes, memory.output_size_in_bytes
        temps, aliased = memory.temp_size_in_bytes, memory.alias_size_in_bytes
        total = arguments + outputs + temps - aliased
        print(
            f"per device, {label}: arguments {arguments / GIB:.2f} GiB, outputs {outputs / GIB:.2f} GiB, "
            f"temps {temps / GIB:.2f} GiB, aliased (donated) {aliased / GIB:.2f} GiB, "
            f"total {total / GIB:.2f} GiB (compile {compile_s:.1f} s)",
            flush=True,
        )
    print(
        f"train state over all devices {sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / GIB:.1f} GiB; "
        f"lower {lower_s:.1f} s"
    )


if __name__ == "__main__":
    main()
