"""Sandbox latency and footprint, against a naive fork-per-trajectory runtime in the same run.

Prints: warm-pool acquire latency, per-call overhead of trivial code (p50/p95), the same two
figures for a multiprocessing worker forked per trajectory (the official design: no
isolation, imports done after the fork), and 32 concurrent sandboxes with their memory.

Usage: .venv/bin/python benchmarks/sandbox.py [--calls 500] [--pool-size 8] [--rounds 3]
                                              [--concurrent 32]
Targets: acquire p50 <= 20 ms, per-call overhead p50 <= 5 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import statistics
import threading
import time

import numpy as np
import psutil
from tqdm import tqdm

from pyvision_jax.agent.sandbox import Sandbox, SandboxConfig, SandboxPool

TRIVIAL_CODE = "pass"


def percentiles(samples_s: list[float]) -> str:
    values = np.asarray(samples_s) * 1000.0
    return (f"p50 {np.percentile(values, 50):8.2f} ms   p95 {np.percentile(values, 95):8.2f} ms"
            f"   (n={len(values)})")


def wait_until(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark setup did not become ready in time")
        time.sleep(0.02)


def bench_pool_acquire(config: SandboxConfig, size: int, rounds: int) -> list[float]:
    samples = []
    with SandboxPool(config, size=size) as pool:
        for _ in tqdm(range(rounds), desc="pool rounds"):
            wait_until(lambda: pool.idle_count() == size, 600)
            leased = []
            for _ in range(size):
                start = time.perf_counter()
                leased.append(pool.acquire())
                samples.append(time.perf_counter() - start)
            for box in leased:
                pool.release(box)
    return samples


def bench_sandbox_calls(config: SandboxConfig, calls: int) -> tuple[list[float], float]:
    with Sandbox(config) as box:
        for _ in range(20):
            box.run(TRIVIAL_CODE)
        samples = []
        for _ in tqdm(range(calls), desc="sandbox calls"):
            start = time.perf_counter()
            result = box.run(TRIVIAL_CODE)
            samples.append(time.perf_counter() - start)
            assert result.error is None
        start = time.perf_counter()
        for _ in range(calls):
            exec(compile(TRIVIAL_CODE, "<code>", "exec"), {})
        in_process = (time.perf_counter() - start) / calls
    return samples, in_process


def naive_worker(connection) -> None:
    """The official design: a forked worker that imports, then execs code with redirected
    stdout. No isolation; a timeout there leaves this process running."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    from PIL import Image  # noqa: F401

    namespace: dict = {}
    connection.send("ready")
    while True:
        code = connection.recv()
        if code is None:
            return
        buffer = io.StringIO()
        error = None
        try:
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
        except Exception as exc:  # noqa: BLE001 - reported like the official runtime
            error = repr(exc)
        connection.send((buffer.getvalue(), error))


def start_naive_worker(context):
    parent, child = context.Pipe()
    process = context.Process(target=naive_worker, args=(child,), daemon=True)
    process.start()
    assert parent.recv() == "ready"
    return process, parent


def stop_naive_worker(process, connection) -> None:
    connection.send(None)
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join()


def bench_naive(calls: int, trajectories: int) -> tuple[list[float], list[float]]:
    context = multiprocessing.get_context("fork")
    acquire = []
    for _ in tqdm(range(trajectories), desc="naive forks"):
        start = time.perf_counter()
        process, connection = start_naive_worker(context)
        acquire.append(time.perf_counter() - start)
        stop_naive_worker(process, connection)
    process, connection = start_naive_worker(context)
    samples = []
    for _ in tqdm(range(calls), desc="naive calls"):
        start = time.perf_counter()
        connection.send(TRIVIAL_CODE)
        connection.recv()
        samples.append(time.perf_counter() - start)
    stop_naive_worker(process, connection)
    return acquire, samples


def sandbox_memory(boxes: list[Sandbox]) -> tuple[float, float]:
    pss = rss = 0
    for box in boxes:
        outer = psutil.Process(box.pid)
        for proc in [outer] + outer.children(recursive=True):
            info = proc.memory_full_info()
            pss += info.pss
            rss += info.rss
    return pss / 2**20, rss / 2**20


def bench_concurrent(config: SandboxConfig, count: int) -> None:
    start = time.perf_counter()
    with SandboxPool(config, size=count) as pool:
        wait_until(lambda: pool.idle_count() == count, 1800)
        warm_s = time.perf_counter() - start
        boxes = [pool.acquire() for _ in range(count)]
        results: list = [None] * count

        def call(index: int) -> None:
            results[index] = boxes[index].run("import numpy as np\n"
                                              "print(int(np.arange(1000).sum()))")

        start = time.perf_counter()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        concurrent_s = time.perf_counter() - start
        assert all(result.stdout == "499500\n" for result in results)
        pss_mib, rss_mib = sandbox_memory(boxes)
    print(f"\n{count} concurrent sandboxes: all started in {warm_s:.1f} s "
          f"({warm_s / count:.2f} s each on {psutil.cpu_count()} cores); one call on each, "
          f"concurrently: {concurrent_s * 1000:.0f} ms")
    print(f"  memory: PSS total {pss_mib:.0f} MiB ({pss_mib / count:.1f} MiB per sandbox), "
          f"RSS total {rss_mib:.0f} MiB ({rss_mib / count:.1f} MiB per sandbox)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--naive-trajectories", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=32)
    args = parser.parse_args()
    config = SandboxConfig(timeout_s=60.0)

    acquire = bench_pool_acquire(config, args.pool_size, args.rounds)
    calls, in_process = bench_sandbox_calls(config, args.calls)
    naive_acquire, naive_calls = bench_naive(args.calls, args.naive_trajectories)

    print(f"\nSandbox (bubblewrap, persistent runtime, warm pool of {args.pool_size})")
    print(f"  acquire from warm pool      {percentiles(acquire)}   target p50 <= 20 ms")
    print(f"  call overhead ('{TRIVIAL_CODE}')     {percentiles(calls)}   target p50 <= 5 ms")
    print(f"  (exec of the same code in-process: {in_process * 1e6:.1f} us)")
    print("Naive runtime (multiprocessing fork per trajectory, no isolation)")
    print(f"  acquire (fork + imports)    {percentiles(naive_acquire)}")
    print(f"  call overhead ('{TRIVIAL_CODE}')     {percentiles(naive_calls)}")
    print(f"p50 ratios: naive acquire / sandbox acquire = "
          f"{statistics.median(naive_acquire) / statistics.median(acquire):.0f}x; "
          f"sandbox call / naive call = {statistics.median(calls) / statistics.median(naive_calls):.1f}x")
    bench_concurrent(config, args.concurrent)


if __name__ == "__main__":
    main()
