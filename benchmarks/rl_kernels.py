"""Benchmark the jitted RL kernels against vectorized numpy in the same run.

  .venv/bin/python -m benchmarks.rl_kernels [--groups 4096 --group-size 16 --batch 256 --length 8192]

Prints, for selection + advantages over [P, G] groups and for the PPO loss over a [B, T]
token batch, the median and minimum wall time (after compilation, with block_until_ready)
of the jitted JAX function and of a numpy implementation of the same math, and their ratio.
The two results are compared before timing so the figures are for equal work. The machine's
load average is printed too: on a shared machine the median mostly measures the contention.

The selection figure is then repeated in a child process with XLA's experimental YNN
fusions switched off (XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=), which makes the
small row reductions of the group statistics cheaper on CPU (--no-ynn-comparison skips it).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.rl import PPOLossConfig, group_advantages, ppo_loss, select_rollouts, take_selected


def timings(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, minimum) wall seconds of `run` over `repeats` calls; the minimum shows the
    cost without interference from other processes on a shared machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def report(label: str, seconds: tuple[float, float]) -> None:
    print(f"  {label:<17}: median {seconds[0] * 1e3:9.3f} ms   min {seconds[1] * 1e3:9.3f} ms")


# ----------------------------------------------------------------------------- selection + advantages


@functools.partial(jax.jit, static_argnames="num_select")
def select_and_advantages(rewards, valid, broken, num_select):
    selection = select_rollouts(rewards, valid, broken, num_select)
    advantages = group_advantages(rewards, valid, broken)
    return selection.indices, selection.real, take_selected(advantages, selection)


def numpy_select_and_advantages(rewards, valid, broken, num_select, std_eps=1e-6, min_members=2):
    usable = valid & ~broken
    count = usable.sum(axis=1)
    mean = np.where(usable, rewards, 0.0).sum(axis=1) / np.maximum(count, 1)
    deviation = np.where(usable, rewards - mean[:, None], 0.0)
    std = np.sqrt((deviation**2).sum(axis=1) / np.maximum(count, 1))
    eligible = valid.any(axis=1) & (count >= min_members) & (std > std_eps)
    key = np.where(eligible, std, -np.inf)
    order = np.lexsort((np.arange(len(key)), -key))[:num_select]
    advantages = np.where(usable, deviation, 0.0)
    return order, eligible[order], advantages[order].reshape(-1), std


def bench_selection(groups: int, group_size: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    rewards = (rng.random((groups, group_size)) < 0.5) + 0.1 * rng.integers(0, 5, (groups, group_size))
    rewards = rewards.astype(np.float32)
    valid = rng.random((groups, group_size)) < 0.95
    broken = rng.random((groups, group_size)) < 0.05
    num_select = groups // 2
    device_args = [jnp.asarray(x) for x in (rewards, valid, broken)]

    indices, real, advantages = select_and_advantages(*device_args, num_select=num_select)
    ref_indices, ref_real, ref_advantages, ref_std = numpy_select_and_advantages(rewards, valid, broken, num_select)
    # Mathematically tied stds may round differently in float32 and float64, so compare the
    # ranked std values rather than the indices of tied groups.
    np.testing.assert_array_equal(np.asarray(real), ref_real)
    np.testing.assert_allclose(ref_std[np.asarray(indices)], ref_std[ref_indices], atol=1e-5)
    np.testing.assert_allclose(np.sort(np.asarray(advantages)), np.sort(ref_advantages), atol=1e-5)

    jax_time = timings(lambda: select_and_advantages(*device_args, num_select=num_select), repeats)
    numpy_time = timings(lambda: numpy_select_and_advantages(rewards, valid, broken, num_select), repeats)
    print(f"selection + advantages  P={groups} G={group_size} keep={num_select}")
    report("jax jit", jax_time)
    report("numpy", numpy_time)
    verdict = "met" if jax_time[0] < 1e-3 else "NOT met"
    print(f"  speedup (median) : {numpy_time[0] / jax_time[0]:9.1f} x   target jit median < 1 ms: {verdict}")


# ----------------------------------------------------------------------------- PPO loss


def numpy_ppo_loss(logprobs, old, advantages, mask, config: PPOLossConfig):
    """token-mean PPO loss with asymmetric and dual clip (the benchmarked configuration)."""
    ratio = np.exp(np.clip(np.where(mask, logprobs - old, 0.0), -20, 20))
    advantage = np.where(mask, advantages[:, None], 0.0)
    unclipped = -advantage * ratio
    clipped = -advantage * np.clip(ratio, 1 - config.eps_low, 1 + config.eps_high)
    loss = np.maximum(unclipped, clipped)
    loss = np.where(advantage < 0, np.minimum(loss, -advantage * config.dual_clip), loss)
    return np.where(mask, loss, 0.0).sum(), mask.sum()


def bench_loss(batch: int, length: int, repeats: int) -> None:
    rng = np.random.default_rng(1)
    logprobs = (-rng.exponential(1.0, (batch, length))).astype(np.float32)
    old = (logprobs + rng.normal(0, 0.1, (batch, length))).astype(np.float32)
    advantages = rng.normal(0, 1, batch).astype(np.float32)
    mask = np.arange(length)[None, :] < rng.integers(length // 4, length + 1, batch)[:, None]
    config = PPOLossConfig()
    device_args = [jnp.asarray(x) for x in (logprobs, old, advantages, mask)]

    forward = jax.jit(lambda lp, o, a, m: ppo_loss(lp, o, a, m, config)[:2])
    gradient = jax.jit(jax.grad(lambda lp, o, a, m: ppo_loss(lp, o, a, m, config).loss_sum))
    loss_sum, denominator = forward(*device_args)
    ref_sum, ref_denominator = numpy_ppo_loss(logprobs, old, advantages, mask, config)
    np.testing.assert_allclose(float(loss_sum), ref_sum, rtol=1e-3)
    assert float(denominator) == ref_denominator
    gradient(*device_args).block_until_ready()

    jax_time = timings(lambda: forward(*device_args), repeats)
    grad_time = timings(lambda: gradient(*device_args), repeats)
    numpy_time = timings(lambda: numpy_ppo_loss(logprobs, old, advantages, mask, config), repeats)
    print(f"PPO loss (token-mean, dual clip)  [{batch}, {length}] = {batch * length:,} tokens")
    report("jax jit forward", jax_time)
    report("jax jit gradient", grad_time)
    report("numpy forward", numpy_time)
    print(f"  speedup (median) : {numpy_time[0] / jax_time[0]:9.1f} x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--loss-repeats", type=int, default=7)
    parser.add_argument("--selection-only", action="store_true", help="skip the loss benchmark")
    parser.add_argument(
        "--no-ynn-comparison", action="store_true", help="skip the child run with XLA's YNN fusions off"
    )
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform} ({len(jax.devices())} device(s)), "
        f"{os.cpu_count()} CPUs, load average {load}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    bench_selection(args.groups, args.group_size, args.repeats)
    if not args.selection_only:
        bench_loss(args.batch, args.length, args.loss_repeats)
    if not args.no_ynn_comparison:
        print("\n--- child process with XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= ---", flush=True)
        env = dict(os.environ, XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=")
        command = [
            sys.executable,
            "-m",
            __spec__.name,
            "--selection-only",
            "--no-ynn-comparison",
            f"--groups={args.groups}",
            f"--group-size={args.group_size}",
            f"--repeats={args.repeats}",
        ]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
