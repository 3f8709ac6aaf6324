"""Training attention on CPU: forward + backward time and compiled memory of each JAX
implementation (models/attention.py) against PyTorch's scaled_dot_product_attention.

Shapes follow benchmarks/train_step.py's model (8 query heads, 2 kv heads, head_dim 32) by
default, causal, one segment per row (what torch's fused causal kernel can also run). Time:
median of the timed calls after one warm-up, JAX and torch calls alternating. Memory: the
temporaries of the compiled JAX forward+backward (`memory_analysis().temp_size_in_bytes`).

    python -m benchmarks.attention [--rows 8] [--length 512] [--heads 8] [--kv-heads 2] [--head-dim 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from pyvision_jax.models.attention import AttentionConfig, attention


def jax_step(config: AttentionConfig, scale: float):
    def loss(q, k, v, segments):
        out = attention(q, k, v, segments, segments, causal=True, scale=scale, config=config)
        return jnp.sum(out * out)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def torch_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int):
    def step():
        qt, kt, vt = (x.detach().requires_grad_() for x in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            qt, kt.repeat_interleave(groups, 1), vt.repeat_interleave(groups, 1), is_causal=True
        )
        (out * out).sum().backward()
        return qt.grad

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    b, t, h, kvh, d = args.rows, args.length, args.heads, args.kv_heads, args.head_dim
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((b, t, n, d)).astype(np.float32) for n in (h, kvh, kvh)]
    q, k, v = (jnp.asarray(x) for x in arrays)
    segments = jnp.ones((b, t), jnp.int32)
    scale = d**-0.5
    runs = {}
    for name in ("dense", "blockwise"):
        step = jax_step(AttentionConfig(name, args.block, args.block), scale)
        temp = step.lower(q, k, v, segments).compile().memory_analysis().temp_size_in_bytes
        runs[name] = (lambda step=step: jax.block_until_ready(step(q, k, v, segments)), temp)
    qt, kt, vt = (torch.from_numpy(x).transpose(1, 2).contiguous() for x in arrays)
    runs["torch sdpa"] = (torch_step(qt, kt, vt, h // kvh), None)
    times = {name: [] for name in runs}
    for index in range(args.steps + 1):
        for name, (run, _) in runs.items():
            start = time.perf_counter()
            run()
            if index:
                times[name].append(time.perf_counter() - start)
    print(
        f"causal attention forward+backward, {b} x {t} tokens, {h} heads / {kvh} kv heads, head_dim {d}, "
        f"block {args.block}, torch threads {torch.get_num_threads()}"
    )
    reference = statistics.median(times["torch sdpa"])
    for name, (_, temp) in runs.items():
        median = statistics.median(times[name])
        memory = "" if temp is None else f", compiled temporaries {temp / 2**20:,.1f} MiB"
        print(f"{name:>11}: median {median * 1e3:8.1f} ms (torch / this: {reference / median:.2f}x){memory}")


if __name__ == "__main__":
    main()
