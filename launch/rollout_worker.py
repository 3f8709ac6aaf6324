"""A rollout worker of a fleet: generates scored trajectory groups into the trajectory queue.

    python launch/rollout_worker.py --config configs/tiny_cpu.py \
        --config.rollout.queue=redis --config.rollout.redis_url=redis://host:6379/0 \
        --worker-index 0 --num-workers 4 --workdir /shared/rollout

Worker I of N takes its shard of the training tasks (see pyvision_jax.rollout.worker), runs
rl.group_size episodes per task with rollout.engine ("jax"; "vllm", run with
.venv-vllm/bin/python; or "scripted" with rollout.script_file, a JSON {task id or "*": [turn
texts]} for dry runs and tests) and loads the weights the trainer announces on the queue.
vLLM starts from model.hf_dir, else from the newest complete version the trainer published
(rollout.weights_dir, else the one announced on the queue), and takes each new version's
safetensors as they are. Its cursor is kept in
WORKDIR/worker-I-of-N.json, so a restarted worker continues where it stopped. SIGTERM
finishes the current group and exits; a second SIGTERM abandons it.

Worker config keys: rollout.script_file, rollout.max_epochs (0: run until stopped),
rollout.poll_s, rollout.queue_namespace (the trainer's).
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.py")

_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Config file.", lock_config=True)
_INDEX = flags.DEFINE_integer("worker-index", 0, "This worker's index in [0, num-workers).")
_COUNT = flags.DEFINE_integer("num-workers", 1, "Workers sharing the tasks.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the cursor (and synthetic tasks).")


def _script(path: str) -> Any:
    """The scripted engine's script: per task id (or "*" for any task) the turn texts."""
    if not path:
        raise app.UsageError("rollout.engine='scripted' needs rollout.script_file")
    script = json.loads(Path(path).read_text())
    if not isinstance(script, dict) or not all(
            isinstance(turns, list) and all(isinstance(t, str) for t in turns)
            for turns in script.values()):
        raise ValueError(f"{path}: expected a JSON object of task id -> list of turn texts")

    def respond(request: Any, turn: int) -> str:
        task_id = request.request_id.rsplit("/", 1)[0]
        turns = script.get(task_id, script.get("*"))
        if turns is None:
            raise KeyError(f"{path}: no script for task {task_id!r} and no '*' entry")
        return turns[min(turn, len(turns) - 1)]

    return respond


def _model_config(config: Any) -> Any:
    from pyvision_jax.models import ModelConfig

    if config.model.hf_dir:
        from pyvision_jax.convert.hf import read_hf_config
        return ModelConfig.from_hf_dict(read_hf_config(Path(config.model.hf_dir)),
                                        source=config.model.hf_dir)
    return ModelConfig.preset(config.model.preset)


def _vllm_engine(config: Any, queue: Any, local_dir: Path) -> tuple[Any, Any]:
    """(ModelConfig, VllmEngine) on model.hf_dir, else on the newest published weights."""
    from pyvision_jax.models import ModelConfig
    from pyvision_jax.rollout.setup import tokenizer_dir, vllm_engine, vllm_model_dir
    from pyvision_jax.rollout.weights import check_complete, latest_complete

    if config.model.hf_dir:
        source, version = Path(config.model.hf_dir), 0
    else:
        weights_dir = config.rollout.weights_dir
        latest = latest_complete(weights_dir) if weights_dir else None
        announced = queue.latest_weights()
        if latest is not None:
            source, version = latest.path, latest.version
        elif announced is not None:
            source, version = Path(announced.location), check_complete(announced.location)
        else:
            raise app.UsageError("rollout.engine='vllm' needs model.hf_dir or weights published by "
                                 "the trainer (rollout.weights_dir, or announced on the queue)")
    model_config = ModelConfig.from_hf_dir(source)
    e = config.episode
    model_dir = vllm_model_dir(source, local_dir, model_config, tokenizer_dir(config),
                               min_pixels=e.image_min_pixels, max_pixels=e.image_max_pixels)
    logging.info("vLLM engine on %s (version %d)", model_dir, version)
    return model_config, vllm_engine(config, model_dir, version=version, max_total_tokens=e.max_total_tokens)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    logging.set_verbosity(logging.INFO)
    worker_holder: dict[str, Any] = {}
    terms = []

    def on_sigterm(signum: int, frame: Any) -> None:
        terms.append(signum)
        if len(terms) > 1:
            raise KeyboardInterrupt("second SIGTERM: abandoning the current group")
        if "worker" in worker_holder:
            worker_holder["worker"].request_stop()

    signal.signal(signal.SIGTERM, on_sigterm)  # before the sandbox pool installs its own

    from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
    from pyvision_jax.agent.engine import SamplingParams
    from pyvision_jax.rollout.queue import QueueConfig, make_queue
    from pyvision_jax.rollout.setup import episode_config, load_tokenizer, training_tasks
    from pyvision_jax.rollout.weights import WeightsWatcher
    from pyvision_jax.rollout.worker import CursorFile, HfTensorsWatcher, RolloutWorker, WorkerConfig, cursor_path

    c = _CONFIG.value
    r = c.rollout
    if r.engine == "vllm":
        from pyvision_jax.rollout.setup import require_vllm
        require_vllm()
    workdir = Path(_WORKDIR.value).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    worker_config = WorkerConfig(
        worker_index=_INDEX.value, num_workers=_COUNT.value, group_size=c.rl.group_size,
        max_staleness=r.max_staleness, max_epochs=r.max_epochs or None,
        seed=c.data.synthetic_seed + c.seed, tool_reward_coef=c.rl.tool_reward_coef,
        poll_s=r.poll_s)
    tokenizer = load_tokenizer(c)
    model_config = _model_config(c)
    tasks = training_tasks(c, workdir / f"worker-{_INDEX.value}")
    queue = make_queue(QueueConfig(backend=r.queue, max_backlog=r.max_backlog, max_staleness=None,
                                   redis_url=r.redis_url,
                                   namespace=r.queue_namespace))
    watcher = WeightsWatcher
    if r.engine == "scripted":
        from pyvision_jax.rollout.scripted_engine import ScriptedEngine
        engine = ScriptedEngine(tokenizer, _script(r.script_file),
                                merge_size=model_config.vision.spatial_merge_size)
    elif r.engine == "jax":
        from pyvision_jax.rollout.setup import build_engine, load_model
        model_config, params = load_model(c)
        engine = build_engine(c, model_config, params, tokenizer, version=0)
    elif r.engine == "vllm":
        model_config, engine = _vllm_engine(c, queue, workdir / f"vllm-model-{_INDEX.value}")
        watcher = HfTensorsWatcher
    else:
        raise app.UsageError(f"rollout.engine={r.engine!r}: this worker runs 'jax', 'vllm' or 'scripted'")
    sandboxes = SandboxPool(SandboxConfig(timeout_s=c.sandbox.timeout_s,
                                          allow_unisolated=c.sandbox.allow_unisolated),
                            size=c.sandbox.pool_size)
    try:
        worker = RolloutWorker(
            worker_config, tasks=tasks, engine=engine, tokenizer=tokenizer, sandboxes=sandboxes,
            queue=queue, episode=episode_config(c, model_config),
            sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k),
            weights=watcher(queue, engine, dtype=c.model.param_dtype),
            cursor=CursorFile(cursor_path(workdir, _INDEX.value, _COUNT.value)),
            log=lambda line: logging.info("%s", line))
        worker_holder["worker"] = worker
        if terms:
            worker.request_stop()
        summary = worker.run()
    finally:
        sandboxes.close()
        queue.close()
    state = "stopped" if summary.stopped else "finished"
    print(f"rollout worker {_INDEX.value}/{_COUNT.value} {state}: {len(summary.produced)} groups "
          f"put, cursor {summary.cursor}, weights loaded {list(summary.versions_loaded)}, "
          f"{summary.pauses} pauses", flush=True)


if __name__ == "__main__":
    app.run(main)
