"""Training throughput: the JAX GRPO train step vs the same step in PyTorch (transformers).

Both sides train the same small Qwen2.5-VL (same weights, vision tower frozen) on the same
batch of image trajectories with the same loss (PPO clipped surrogate, token-mean, logits
divided by the rollout temperature, old logprobs = the current ones detached), global-norm
clipping and AdamW. Reported: real (non-padding) tokens per second of a full optimizer step,
median over the timed steps, after warm-up (compilation) steps; ratio = JAX / PyTorch. The
timed JAX and PyTorch steps alternate, so that a change of machine load hits both alike.
PyTorch runs transformers' SDPA attention. Then each side runs alone in a child process
(`--side`), which reports its peak resident memory (ru_maxrss: loading, compiling and steps).

    python -m benchmarks.train_step [--rows 8] [--length 512] [--steps 5]
    python -m benchmarks.train_step --rows 2 --length 4096 --steps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from pyvision_jax.agent.trajectory import ContextImage, EndReason, Trajectory
from pyvision_jax.convert import load_hf
from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.models import ModelConfig, param_logical_axes
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, pack_batch
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, make_train_step

TEMPERATURE, LR, WEIGHT_DECAY, CLIP, EPS = 1.0, 1e-5, 0.01, 1.0, 0.2


def bench_config() -> ModelConfig:
    base = ModelConfig.preset("tiny")
    vision = dataclasses.replace(
        base.vision,
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=2,
        out_hidden_size=256,
        fullatt_block_indexes=(1,),
    )
    return dataclasses.replace(
        base,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        mrope_section=(4, 6, 6),
        vision=vision,
    )


def trajectories(config: ModelConfig, rows: int, length: int) -> list[Trajectory]:
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for r in range(rows):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)).save(buffer, format="PNG")
        prompt = rng.integers(10, 1900, 40).tolist() + [config.vision_start_token_id] + [config.image_token_id] * 16
        prompt += [config.vision_end_token_id] + rng.integers(10, 1900, 20).tolist()
        generated = length - len(prompt) - 8 * (r % 4)
        ids = prompt + rng.integers(10, 1900, generated).tolist()
        mask = np.r_[np.zeros(len(prompt)), np.ones(generated)].astype(np.int8)
        out.append(
            Trajectory(
                task_id=f"b{r}",
                rollout_index=0,
                token_ids=np.asarray(ids),
                loss_mask=mask,
                logprobs=np.where(mask, -2.0, 0.0),
                prompt_length=len(prompt),
                images=(ContextImage(0, "task", buffer.getvalue(), (1, 8, 8), 16),),
                turns=(),
                num_tool_calls=0,
                num_successful_tool_calls=0,
                end_reason=EndReason.DONE,
                broken=False,
                final_answer=None,
                policy_version=0,
            )
        )
    return out


def interleaved_times(steps: dict, warmup: int, count: int) -> dict[str, list[float]]:
    """Wall times of `count` calls of each step, the steps alternating, after `warmup` each."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(count):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def jax_step(config, params, batch):
    """One JAX train step (state kept between calls), blocking until it is done."""
    optimizer = make_optimizer(OptimizerConfig(lr=LR, weight_decay=WEIGHT_DECAY, grad_clip=CLIP))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    state = init_train_state(params, optimizer, 0)
    shardings = state_shardings(state, param_logical_axes(config), mesh)
    holder = {"state": jax.device_put(state, shardings)}
    step_fn = make_train_step(
        config, StepConfig(temperature=TEMPERATURE, logprob_chunk=128), optimizer, mesh, shardings, donate=True
    )
    device_batch = shard_batch(batch, mesh)

    def step():
        holder["state"], out = step_fn(holder["state"], device_batch)
        jax.block_until_ready(out)

    return step


def torch_step(model, config, batch):
    """The same step on the transformers model with torch.optim.AdamW."""
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith(("visual.", "model.visual.")))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
    ids = torch.as_tensor(np.asarray(batch.input_ids[0]), dtype=torch.long)
    attention = torch.as_tensor(np.asarray(batch.attention_mask[0]), dtype=torch.long)
    positions = torch.as_tensor(np.asarray(batch.positions[0]), dtype=torch.long)
    loss_mask = torch.as_tensor(np.asarray(batch.loss_mask[0] & batch.attention_mask[0]))
    advantages = torch.as_tensor(np.asarray(batch.advantages[0]))[:, None]
    grids = np.asarray([[1, 8, 8]] * ids.shape[0])
    layout = batch.layout
    slots = np.asarray(layout.patch_index[0])[np.asarray(layout.slot_valid[0])]
    pixels = np.zeros((grids.prod(-1).sum(), config.vision.patch_dim), np.float32)
    pixels[slots] = np.asarray(batch.pixel_values[0])[np.asarray(layout.slot_valid[0])]
    pixels = torch.as_tensor(pixels)
    mm_types = torch.as_tensor((np.asarray(batch.input_ids[0]) == config.image_token_id).astype(np.int64))
    model.train()

    def step():
        logits = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            pixel_values=pixels,
            image_grid_thw=torch.as_tensor(grids),
            mm_token_type_ids=mm_types,
        ).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1] / TEMPERATURE, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        logprobs = torch.nn.functional.pad(logprobs, (1, 0))
        ratio = torch.exp(logprobs - logprobs.detach())
        token_loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - EPS, 1 + EPS))
        loss = (token_loss * loss_mask).sum() / loss_mask.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, CLIP)
        optimizer.step()

    return step


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_sides(hf_dir: str, side: str) -> tuple:
    """(torch model with SDPA attention or None, JAX params or None) from the saved checkpoint."""
    model = params = None
    if side in ("both", "torch"):
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
    if side in ("both", "jax"):
        _, params = load_hf(hf_dir, dtype="float32", progress=False)
    return model, params


def child_peak_rss(args: argparse.Namespace, hf_dir: str, side: str) -> float:
    """Peak RSS (MiB) of one side's warm-up and steps, alone in a child process."""
    command = [
        sys.executable,
        "-m",
        __spec__.name,
        "--side",
        side,
        "--hf-dir",
        hf_dir,
        "--rows",
        str(args.rows),
        "--length",
        str(args.length),
        "--steps",
        "1",
        "--warmup",
        "1",
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(out.split("peak_rss_mib=")[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--side",
        choices=("both", "jax", "torch"),
        default="both",
        help="jax/torch: run that side alone and print its peak RSS (used by the parent)",
    )
    parser.add_argument("--hf-dir", default="", help="the saved model (children)")
    args = parser.parse_args()
    config = bench_config()
    rows = trajectories(config, args.rows, args.length)
    batch, stats = pack_batch(config, rows, np.linspace(-1, 1, args.rows), BatchingConfig((args.length,), args.rows))
    if args.side != "both":
        model, params = load_sides(args.hf_dir, args.side)
        step = jax_step(config, params, batch) if args.side == "jax" else torch_step(model, config, batch)
        interleaved_times({args.side: step}, args.warmup, args.steps)
        print(f"peak_rss_mib={peak_rss_mib():.0f}")
        return
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**hf_config_dict(config))).to(
            torch.float32
        ).save_pretrained(tmp)
        model, params = load_sides(tmp, "both")
        rss = {side: child_peak_rss(args, tmp, side) for side in ("jax", "torch")}
    print(
        f"model: hidden {config.hidden_size}, {config.num_hidden_layers} layers, vocab {config.vocab_size}, "
        f"vision depth {config.vision.depth} (frozen); batch {stats.rows} x {stats.length}, "
        f"{stats.real_tokens} real tokens, {stats.loss_tokens} loss tokens, {stats.images} images; "
        f"torch threads {torch.get_num_threads()}, jax devices {jax.devices()}"
    )
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    times = interleaved_times(
        {"jax": jax_step(config, params, batch), "torch": torch_step(model, config, batch)}, args.warmup, args.steps
    )
    jax_times, torch_times = times["jax"], times["torch"]
    jax_tps = stats.real_tokens / statistics.median(jax_times)
    torch_tps = stats.real_tokens / statistics.median(torch_times)
    print(f"JAX     step: median {statistics.median(jax_times):.3f} s  -> {jax_tps:,.0f} tokens/s")
    print(f"PyTorch step: median {statistics.median(torch_times):.3f} s  -> {torch_tps:,.0f} tokens/s")
    print(f"ratio JAX / PyTorch: {jax_tps / torch_tps:.2f}x")
    print(
        f"peak RSS alone: JAX {rss['jax']:,.0f} MiB, PyTorch {rss['torch']:,.0f} MiB "
        f"(JAX / PyTorch {rss['jax'] / rss['torch']:.2f}x)"
    )
    print("load average (1, 5, 15 min) after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
