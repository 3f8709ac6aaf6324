"""Sandbox latency and footprint, against a naive fork-per-trajectory runtime in the same run;
and the cost of starting runtimes, forked from a pool's template against a fresh bubblewrap
each (the path where forks are unavailable), in the same run.

Prints: warm-pool acquire latency, per-call overhead of trivial code (p50/p95), the same two
figures for a multiprocessing worker forked per trajectory (the official design: no
isolation, imports done after the fork), 32 concurrent sandboxes with their memory; then,
with this process and every sandbox pinned to one core, the CPU one runtime start costs
(p50/p95; the sandbox's processes, read from /proc/<pid>/task/*/schedstat when it is ready,
plus what the template reports for the fork and the process that made its namespaces; and
this process's own CPU) and the rate at which a pool refills after all its sandboxes were
released (destroying them included), for both kinds of runtime.

Usage: .venv/bin/python -m benchmarks.sandbox [--calls 500] [--pool-size 8] [--rounds 3]
                                              [--concurrent 32] [--starts 40]
                                              [--refill-size 16] [--refill-rounds 2]
Targets: acquire p50 <= 20 ms, per-call overhead p50 <= 5 ms; forked start <= 50 ms of CPU
(p50), pool refill >= 20 runtimes/s on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import multiprocessing
import os
import statistics
import threading
import time

import numpy as np
import psutil
from tqdm import tqdm

from pyvision_jax.agent.sandbox import Sandbox, SandboxConfig, SandboxPool
from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.fork_server import ForkServer
from pyvision_jax.agent.sandbox.host_dirs import create_host_dir, remove_host_dir
from pyvision_jax.agent.sandbox.isolation import isolation_mode
from pyvision_jax.agent.sandbox.process import RuntimeProcess

TRIVIAL_CODE = "pass"


def percentiles(samples_s: list[float]) -> str:
    values = np.asarray(samples_s) * 1000.0
    return f"p50 {np.percentile(values, 50):8.2f} ms   p95 {np.percentile(values, 95):8.2f} ms   (n={len(values)})"


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
            results[index] = boxes[index].run("import numpy as np\nprint(int(np.arange(1000).sum()))")

        start = time.perf_counter()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        concurrent_s = time.perf_counter() - start
        assert all(result.stdout == "499500\n" for result in results)
        pss_mib, rss_mib = sandbox_memory(boxes)
    print(
        f"\n{count} concurrent sandboxes: all started in {warm_s:.1f} s "
        f"({warm_s / count:.2f} s each on {psutil.cpu_count()} cores); one call on each, "
        f"concurrently: {concurrent_s * 1000:.0f} ms"
    )
    print(
        f"  memory: PSS total {pss_mib:.0f} MiB ({pss_mib / count:.1f} MiB per sandbox), "
        f"RSS total {rss_mib:.0f} MiB ({rss_mib / count:.1f} MiB per sandbox)"
    )


def process_cpu_s(pid: int) -> float:
    """CPU seconds of all threads of a live process, to the nanosecond (schedstat)."""
    total_ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
            total_ns += int(handle.read().split()[0])
    return total_ns / 1e9


def reaped_children_cpu_s(pid: int) -> float:
    """CPU seconds of the children a live process has reaped (clock ticks: coarse)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU of a live process tree: its processes, and what they reaped."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root] + root.children(recursive=True):
        with contextlib.suppress(OSError, psutil.Error):
            total += process_cpu_s(proc.pid) + reaped_children_cpu_s(proc.pid)
    return total


def pin_to_one_core() -> int:
    """Pins every thread of this process (and so everything it starts from now on) to one
    core; returns it."""
    core = min(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), {core})
    return core


def bench_start_cpu(config: SandboxConfig, server: ForkServer | None, starts: int) -> tuple[list[float], list[float]]:
    """(sandbox-side CPU, host-side CPU) of each of `starts` runtime starts, one at a time:
    forked from `server`'s template, or each in a fresh bubblewrap without one."""
    mode, bwrap = isolation_mode(config)
    memory = SandboxMemory.for_pool(config.memory_bytes)
    sandbox_cpu, host_cpu = [], []
    for _ in tqdm(range(starts), desc="forked starts" if server else "bubblewrap starts"):
        host_dir, owner_lock = server.create_host_dir() if server else create_host_dir()
        (host_dir / "media").mkdir(mode=0o755)
        start = time.process_time()
        if server is not None:
            runtime = server.start_runtime(host_dir, lambda: False, memory)
            assert runtime is not None, "forks are unavailable on this host"
            host_cpu.append(time.process_time() - start)
            sandbox_cpu.append(runtime.fork_cpu_s + tree_cpu_s(runtime.pid))
        else:
            runtime = RuntimeProcess(config, mode, bwrap, host_dir, lambda: False, memory)
            host_cpu.append(time.process_time() - start)
            sandbox_cpu.append(tree_cpu_s(runtime.pid))
        runtime.kill()
        remove_host_dir(host_dir, owner_lock)
    return sandbox_cpu, host_cpu


def bench_refill(config: SandboxConfig, size: int, rounds: int) -> float:
    """Runtimes per second a pool of `size` starts to be full again after all its sandboxes
    were acquired and released at once (their destruction included)."""
    rates = []
    with SandboxPool(config, size=size) as pool:
        wait_until(lambda: pool.idle_count() == size, 1800)
        for _ in tqdm(range(rounds), desc=f"refills (fork_runtimes={config.fork_runtimes})"):
            leased = [pool.acquire() for _ in range(size)]
            start = time.perf_counter()
            for box in leased:
                pool.release(box)
            wait_until(lambda: pool.idle_count() == size, 1800)
            rates.append(size / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_starts(config: SandboxConfig, starts: int, refill_size: int, refill_rounds: int) -> None:
    core = pin_to_one_core()
    mode, bwrap = isolation_mode(config)
    server = ForkServer(config, mode, bwrap)
    try:
        warm_dir, warm_lock = server.create_host_dir()
        (warm_dir / "media").mkdir(mode=0o755)
        warm = server.start_runtime(
            warm_dir, lambda: False, SandboxMemory.for_pool(config.memory_bytes)
        )  # the template starts here
        assert warm is not None, "forks are unavailable on this host"
        warm.kill()
        remove_host_dir(warm_dir, warm_lock)
        forked = bench_start_cpu(config, server, starts)
    finally:
        server.close()
    bubblewrap = bench_start_cpu(config, None, max(starts // 4, 5))
    forked_rate = bench_refill(config, refill_size, refill_rounds)
    bubblewrap_rate = bench_refill(dataclasses.replace(config, fork_runtimes=False), refill_size, refill_rounds)
    print(f"\nRuntime starts, everything pinned to core {core} ({mode} mode)")
    print(
        f"  forked:     sandbox CPU {percentiles(forked[0])};  host CPU p50 "
        f"{statistics.median(forked[1]) * 1000:.2f} ms   target p50 <= 50 ms"
    )
    print(
        f"  bubblewrap: sandbox CPU {percentiles(bubblewrap[0])};  host CPU p50 "
        f"{statistics.median(bubblewrap[1]) * 1000:.2f} ms"
    )
    print(
        f"  p50 sandbox CPU: bubblewrap / forked = "
        f"{statistics.median(bubblewrap[0]) / statistics.median(forked[0]):.1f}x"
    )
    print(
        f"Pool refill (pool of {refill_size}, one core): forked {forked_rate:.1f} runtimes/s, "
        f"bubblewrap {bubblewrap_rate:.1f} runtimes/s ({forked_rate / bubblewrap_rate:.1f}x); "
        f"target >= 20 runtimes/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--naive-trajectories", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--refill-size", type=int, default=16)
    parser.add_argument("--refill-rounds", type=int, default=2)
    args = parser.parse_args()
    config = SandboxConfig(timeout_s=60.0)

    acquire = bench_pool_acquire(config, args.pool_size, args.rounds)
    calls, in_process = bench_sandbox_calls(config, args.calls)
    naive_acquire, naive_calls = bench_naive(args.calls, args.naive_trajectories)

    print(f"\nSandbox (persistent runtime, warm pool of {args.pool_size} forked from its template)")
    print(f"  acquire from warm pool      {percentiles(acquire)}   target p50 <= 20 ms")
    print(f"  call overhead ('{TRIVIAL_CODE}')     {percentiles(calls)}   target p50 <= 5 ms")
    print(f"  (exec of the same code in-process: {in_process * 1e6:.1f} us)")
    print("Naive runtime (multiprocessing fork per trajectory, no isolation)")
    print(f"  acquire (fork + imports)    {percentiles(naive_acquire)}")
    print(f"  call overhead ('{TRIVIAL_CODE}')     {percentiles(naive_calls)}")
    print(
        f"p50 ratios: naive acquire / sandbox acquire = "
        f"{statistics.median(naive_acquire) / statistics.median(acquire):.0f}x; "
        f"sandbox call / naive call = {statistics.median(calls) / statistics.median(naive_calls):.1f}x"
    )
    bench_concurrent(config, args.concurrent)
    bench_starts(config, args.starts, args.refill_size, args.refill_rounds)


if __name__ == "__main__":
    main()
