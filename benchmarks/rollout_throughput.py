"""Rollout throughput of the four-kind toy's producer with each improvement off and on, in one run:
the packaged SFT model (configs/kinds_cpu.py), real sandboxes, its synthetic tasks,
group size, concurrency and engine shapes.

    .venv/bin/python -m benchmarks.rollout_throughput [--rounds 2] [--tasks 8] [--out results.json]

Variants (each a fresh engine and sandbox pool, one warm-up round, round 0, then `--rounds`
timed rounds on the same tasks and seeds; all but `all+warm_up` with `rollout.warm_up` off):
- `baseline`: a fresh bubblewrap and Python per sandbox, every turn prefilled in full, one
  decode step per dispatch;
- `decode_chunk_8`: the same with 8 decode steps per dispatch in one compiled loop that stops
  once every row has ended;
- `+forked_sandboxes`, `+kv_continuation`: the improvements added one at a time;
- `all`: forked sandboxes, KV continuation and 8 decode steps per dispatch (the defaults);
- `all+warm_up`: the same with `rollout.warm_up`, the engine compiling every shape it can
  dispatch when built (its compiles and seconds are reported);
- `all+rows_32`: `all` with every dispatch padded to all 32 rows (`rollout.batch_sizes`), one
  executable per shape rather than one per row count.
It prints episodes/s and generated tokens/s per variant with the ratio to `baseline`, and where
each round's time goes: the engine's prefill, extension and decode calls (host timers around
each jitted call up to its results), the XLA compilations of the round (the engine's new
executables, and every backend compile the process made with its seconds, from
`jax.monitoring`) and the time outside the engine (sandbox starts and tool runs the engine
waited for, grading, the episode driver).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax

from benchmarks.machine import describe_machine
from configs.kinds_cpu import get_config
from pyvision_jax import wiring
from pyvision_jax.agent.engine import Engine, GenerationRequest, GenerationResult, SamplingParams
from pyvision_jax.data.task_order import TaskShard

COLD = {"rollout.warm_up": False}
VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"sandbox.fork_runtimes": False, "rollout.kv_continuation": False, "rollout.decode_chunk": 1, **COLD},
    "decode_chunk_8": {
        "sandbox.fork_runtimes": False,
        "rollout.kv_continuation": False,
        "rollout.decode_chunk": 8,
        **COLD,
    },
    "+forked_sandboxes": {
        "sandbox.fork_runtimes": True,
        "rollout.kv_continuation": False,
        "rollout.decode_chunk": 1,
        **COLD,
    },
    "+kv_continuation": {
        "sandbox.fork_runtimes": True,
        "rollout.kv_continuation": True,
        "rollout.decode_chunk": 1,
        **COLD,
    },
    "all": {"sandbox.fork_runtimes": True, "rollout.kv_continuation": True, "rollout.decode_chunk": 8, **COLD},
}
VARIANTS["all+warm_up"] = VARIANTS["all"] | {"rollout.warm_up": True}
VARIANTS["all+rows_32"] = VARIANTS["all"] | {"rollout.batch_sizes": (32,)}  # every dispatch at all 32 rows
PHASES = ("prefill", "extend", "decode")
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # one per XLA compile or persistent-cache load
COMPILE_EVENTS = (  # a compilation's stages: tracing to a jaxpr, lowering to MLIR, the backend's compile
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE,
)


class CompileClock:
    """Counts the process's XLA backend compilations and the seconds of every compilation
    stage (a `jax.monitoring` listener, registered once)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **_: Any) -> None:
        if event in COMPILE_EVENTS:
            self.count += event == BACKEND_COMPILE
            self.seconds += duration

    def reading(self) -> tuple[int, float]:
        return self.count, self.seconds


class TimedEngine:
    """An engine whose `generate` calls are timed (the episode driver calls it from one thread)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.busy_s = 0.0
        self.calls = 0

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        start = time.perf_counter()
        try:
            return self.engine.generate(requests, sampling)
        finally:
            self.busy_s += time.perf_counter() - start
            self.calls += 1

    def update_weights(self, weights: Any, version: int) -> None:
        self.engine.update_weights(weights, version)

    @property
    def version(self) -> int:
        return self.engine.version


def variant_config(overrides: dict[str, Any]):
    config = copy.deepcopy(get_config())
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        config[section][field] = value
    return config


def run_round(producer: Any, engine: TimedEngine, items: list, clock: CompileClock) -> dict[str, Any]:
    """One `produce` of `items`, with where its time went."""
    inner = engine.engine
    engine.busy_s, engine.calls = 0.0, 0
    compiled, (xla_compiles, compile_s) = inner.compiles, clock.reading()
    tokens_before, seconds_before = dict(inner.token_counts), dict(inner.seconds)
    start = time.perf_counter()
    groups = producer.produce(items)
    wall = time.perf_counter() - start
    counts = {k: v - tokens_before.get(k, 0) for k, v in inner.token_counts.items()}
    trajectories = [t for g in groups for t in g.trajectories]
    return {
        "wall_s": wall,
        "episodes": len(trajectories),
        "generated_tokens": sum(int(t.loss_mask.sum()) for t in trajectories),
        "engine_s": engine.busy_s,
        "outside_engine_s": wall - engine.busy_s,
        **{f"{phase}_s": inner.seconds[phase] - seconds_before.get(phase, 0.0) for phase in PHASES},
        "engine_calls": engine.calls,
        "tool_s": sum(t.timings.get("tool_s", 0.0) for t in trajectories),
        "tool_calls": sum(t.num_tool_calls for t in trajectories),
        "prefilled_tokens": counts.get("prefilled", 0),
        "reused_tokens": counts.get("reused", 0),
        "compiles": inner.compiles - compiled,
        "xla_compiles": clock.count - xla_compiles,
        "compile_s": clock.seconds - compile_s,
    }


def run_variant(
    name: str, overrides: dict[str, Any], workdir: Path, tasks: int, rounds: int, clock: CompileClock
) -> dict[str, Any]:
    config = variant_config(overrides)
    tokenizer = wiring.load_tokenizer(config)
    model, params = wiring.load_model(config)
    before, start = clock.reading(), time.perf_counter()
    engine = TimedEngine(
        wiring.jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=config.episode.max_total_tokens)
    )
    built = {
        "s": time.perf_counter() - start,
        "compiles": engine.engine.compiles,
        "xla_compiles": clock.count - before[0],
        "compile_s": clock.seconds - before[1],
    }
    shard = TaskShard(wiring.training_tasks(config, workdir), wiring.task_order_seed(config))
    items = shard.take(0, tasks)
    with wiring.sandbox_pool(config) as sandboxes:
        producer = wiring.producer(config, engine, tokenizer, sandboxes, wiring.episode_config(config, model))
        warm_round = run_round(producer, engine, items, clock)  # compiles what the engine's warm-up did not
        timed = [run_round(producer, engine, items, clock) for _ in range(rounds)]
    wall = sum(r["wall_s"] for r in timed)
    episodes = sum(r["episodes"] for r in timed)
    tokens = sum(r["generated_tokens"] for r in timed)
    engine_s = sum(r["engine_s"] for r in timed)
    return {
        "name": name,
        "overrides": overrides,
        "episodes_per_s": episodes / wall,
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "engine_share": engine_s / wall,
        "engine_calls": sum(r["engine_calls"] for r in timed),
        "tool_s_per_episode": sum(r["tool_s"] for r in timed) / max(episodes, 1),
        "prefilled_tokens": sum(r["prefilled_tokens"] for r in timed),
        "reused_tokens": sum(r["reused_tokens"] for r in timed),
        "compiles_in_timed_rounds": sum(r["compiles"] for r in timed),
        "engine_build": built,
        "warm_up_round": warm_round,
        "rounds": timed,
    }


def print_rounds(results: list[dict[str, Any]]) -> None:
    """Per variant and round (0: the warm-up round): wall time, the engine's calls, compiles
    and the time outside the engine."""
    header = ("variant", "round", "wall s", "prefill", "extend", "decode", "compiles", "xla", "compile s", "outside")
    print("\n{:<18} {:>5} {:>7} {:>7} {:>7} {:>7} {:>8} {:>5} {:>9} {:>7}".format(*header))
    for r in results:
        build = r["engine_build"]
        print(
            f"{r['name']:<18} {'build':>5} {build['s']:>7.1f} {'':>7} {'':>7} {'':>7} {build['compiles']:>8d} "
            f"{build['xla_compiles']:>5d} {build['compile_s']:>9.1f}"
        )
        for index, row in enumerate([r["warm_up_round"], *r["rounds"]]):
            print(
                f"{r['name']:<18} {index:>5d} {row['wall_s']:>7.1f} {row['prefill_s']:>7.1f} {row['extend_s']:>7.1f} "
                f"{row['decode_s']:>7.1f} {row['compiles']:>8d} {row['xla_compiles']:>5d} {row['compile_s']:>9.1f} "
                f"{row['outside_engine_s']:>7.1f}"
            )
    print("\n(seconds; build: the engine's construction, its warm-up included; round 0: the warm-up round;")
    print(" prefill / extend / decode: the engine's jitted calls up to their results, compilation included;")
    print(" compiles: the engine's new executables; xla: every XLA compile or persistent-cache load of the")
    print(" process; compile s: their seconds with tracing and lowering; outside: the time outside `generate`)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per variant")
    parser.add_argument("--tasks", type=int, default=0, help="tasks per round (0: the config's ceil(alpha * B))")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the variants")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    base = get_config()
    tasks = args.tasks or wiring.prompts_per_round(base)
    workdir = Path(tempfile.mkdtemp(prefix="rollout-throughput-"))
    wiring.use_compilation_cache(workdir)
    names = [name for name in args.variants.split(",") if name]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    print(
        f"producer: {tasks} tasks x G={base.rl.group_size} per round, max_concurrent "
        f"{base.episode.max_concurrent}, max_batch {base.rollout.max_batch}, {args.rounds} timed round(s) per variant"
    )
    clock = CompileClock()
    results = [run_variant(name, VARIANTS[name], workdir, tasks, args.rounds, clock) for name in names]
    reference = next((r for r in results if r["name"] == "baseline"), results[0])
    header = ("variant", "episodes/s", "tokens/s", "ratio", "engine", "calls", "tool s/ep", "prefilled", "reused")
    print("\n{:<18} {:>10} {:>9} {:>6} {:>6} {:>5} {:>9} {:>9} {:>7} compiles".format(*header))
    for r in results:
        ratio = r["episodes_per_s"] / reference["episodes_per_s"]
        r["ratio_to_baseline"] = ratio
        print(
            f"{r['name']:<18} {r['episodes_per_s']:>10.3f} {r['tokens_per_s']:>9.1f} {ratio:>5.2f}x "
            f"{r['engine_share']:>6.0%} {r['engine_calls']:>5d} {r['tool_s_per_episode']:>9.3f} "
            f"{r['prefilled_tokens']:>9d} {r['reused_tokens']:>7d} {r['compiles_in_timed_rounds']:>8d}"
        )
    print("\n(engine: share of the round's wall time inside `generate`; the rest is sandbox starts and tool runs")
    print(" the engine waited for, grading and the episode driver; tool s/ep: sandbox time per episode;")
    print(" prefilled / reused: prompt tokens prefilled and taken from a held cache; compiles: in timed rounds)")
    print_rounds(results)
    if args.out:
        report = {
            "command": " ".join([".venv/bin/python -m benchmarks.rollout_throughput", *sys.argv[1:]]),
            "machine": describe_machine(),
            "tasks": tasks,
            "rounds": args.rounds,
            "results": results,
        }
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
