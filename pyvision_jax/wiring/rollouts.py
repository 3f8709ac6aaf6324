"""The `rollout` section: the trajectory queue, the group producer, the trainer's group
source of `rollout.mode` and the fleet's rollout workers. Nothing else reads the rollout
topology: the trainer gets a `build_source(params)` callable."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.agent.engine import Engine
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import SandboxSource
from pyvision_jax.convert.hf_config import load_model_config
from pyvision_jax.convert.run_layout import SPOOL_DIR, WEIGHTS_DIR
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.intake import GroupSpool
from pyvision_jax.rollout.producer import GroupProducer, ProducerConfig
from pyvision_jax.rollout.queue import DeliveredGroups, QueueConfig, TrajectoryQueue, make_queue
from pyvision_jax.rollout.scripted_engine import ScriptedEngine, script_from_file
from pyvision_jax.rollout.sources import BackgroundSource, FleetSource, SyncSource
from pyvision_jax.rollout.weights.in_process import WeightsInbox
from pyvision_jax.rollout.weights.publisher import WeightsPublisher
from pyvision_jax.rollout.weights.version_dirs import check_complete, latest_complete, published_files
from pyvision_jax.rollout.weights.watchers import HfTensorsWatcher, WeightsWatcher
from pyvision_jax.rollout.worker import CursorFile, RolloutWorker, WorkerConfig, cursor_path
from pyvision_jax.wiring.credentials import queue_password
from pyvision_jax.wiring.engines import jax_engine, require_vllm, vllm_engine, vllm_model_dir
from pyvision_jax.wiring.episodes import episode_config, sampling_params, sandbox_pool, scorer_routes
from pyvision_jax.wiring.model import hf_dir, load_model, load_tokenizer, model_config, tokenizer_dir
from pyvision_jax.wiring.tasks import task_order_seed, training_tasks

TRAINER_CONSUMER = "trainer"
MODES = ("sync", "async", "external")


def queue_config(
    config: ml_collections.ConfigDict, *, max_staleness: int | None, consumer: str | None = None
) -> QueueConfig:
    r = config.rollout
    redis = r.queue == "redis"
    return QueueConfig(
        backend=r.queue,
        max_backlog=r.max_backlog,
        max_staleness=max_staleness,
        redis_url=r.redis_url,
        namespace=r.queue_namespace,
        consumer=consumer,
        outage_s=r.wait_timeout_s,
        password=queue_password(config) if redis else None,
        ca_file=r.redis_ca_file,
    )


def trajectory_queue(config: ml_collections.ConfigDict, *, max_staleness: int | None) -> TrajectoryQueue:
    return make_queue(queue_config(config, max_staleness=max_staleness))


def producer(
    config: ml_collections.ConfigDict, engine: Engine, tokenizer: Any, sandboxes: SandboxSource, episode: EpisodeConfig
) -> GroupProducer:
    return GroupProducer(
        ProducerConfig(group_size=config.rl.group_size, tool_reward_coef=config.rl.tool_reward_coef, seed=config.seed),
        engine=engine,
        tokenizer=tokenizer,
        sandboxes=sandboxes,
        episode=episode,
        sampling=sampling_params(config.rollout),
        routes=scorer_routes(config),
    )


def prompts_per_round(config: ml_collections.ConfigDict) -> int:
    """ceil(oversample * B): the tasks drawn per generation round."""
    if not config.rl.oversample >= 1:
        raise ValueError(f"rl.oversample must be >= 1, got {config.rl.oversample}")
    return math.ceil(config.rl.oversample * config.rl.batch_groups)


def group_source(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    *,
    engine: Engine | None = None,
    sandboxes: SandboxSource | None = None,
    tasks: Sequence[Task] | None = None,
) -> Any:
    """The trainer's `GroupSource` of `rollout.mode` ("sync", "async" or "external").
    `engine`, `sandboxes` and `tasks` replace what the config would build; what is built here
    is closed with the source."""
    r = config.rollout
    if r.mode not in MODES:
        raise ValueError(f"rollout.mode={r.mode!r} must be one of {MODES}")
    if r.mode == "async" and r.max_staleness < 1:
        raise ValueError(
            f"rollout.mode='async' generates during each train step, so its groups are at least one "
            f"version old: set rollout.max_staleness >= 1 (got {r.max_staleness}; with "
            f"rl.importance_sampling to correct them) or use rollout.mode='sync'"
        )
    if r.mode == "external":
        settings = queue_config(config, max_staleness=r.max_staleness, consumer=TRAINER_CONSUMER)
        queue, delivered = make_queue(settings), DeliveredGroups.for_queue(settings, ttl_s=r.dedup_ttl_s)
        publisher = WeightsPublisher(
            r.weights_dir or Path(workdir) / WEIGHTS_DIR,
            model,
            queue=queue,
            dtype=r.publish_dtype,
            frozen_groups=("visual",) if config.train.freeze_vision else (),
        )
        return FleetSource(
            queue,
            publisher,
            delivered,
            publish_every=r.publish_every,
            wait_timeout_s=r.wait_timeout_s,
            spool=GroupSpool(Path(workdir) / SPOOL_DIR),
            closers=(queue.close, delivered.close),
        )
    if r.engine != "jax":
        raise ValueError(
            f"rollout.engine={r.engine!r} cannot run inside the trainer; use "
            f"rollout.mode='external' with a fleet, or rollout.engine='jax'"
        )
    closers = []
    if sandboxes is None:
        sandboxes = sandbox_pool(config)
        closers.append(sandboxes.close)
    engine = engine or jax_engine(
        config, model, params, tokenizer, version=0, max_total_tokens=config.episode.max_total_tokens
    )
    tasks = training_tasks(config, workdir) if tasks is None else tasks
    made = producer(config, engine, tokenizer, sandboxes, episode_config(config, model))
    if r.mode == "sync":
        return SyncSource(made, TaskShard(tasks, task_order_seed(config)), closers)
    queue = trajectory_queue(config, max_staleness=r.max_staleness)
    inbox = WeightsInbox(engine, on_loaded=queue.set_trainer_version)
    worker = RolloutWorker(
        WorkerConfig(
            seed=task_order_seed(config),
            groups_per_batch=prompts_per_round(config),
            max_staleness=None,
            poll_s=r.poll_s,
        ),
        tasks=tasks,
        producer=made,
        queue=queue,
        weights=inbox,
    )
    return BackgroundSource(worker, inbox, queue, r.wait_timeout_s, closers=[*closers, queue.close])


# ----------------------------------------------------------------------------- fleet workers


def _fleet_vllm_engine(
    config: ml_collections.ConfigDict, queue: TrajectoryQueue, local_dir: Path
) -> tuple[ModelConfig, Engine]:
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
            raise ValueError(
                "rollout.engine='vllm' needs model.hf_dir or weights published by the trainer "
                "(rollout.weights_dir, or announced on the queue)"
            )
        weight_files = published_files(source)  # with the frozen tower's file
    model = load_model_config(source)
    e = config.episode
    model_dir = vllm_model_dir(
        source,
        local_dir,
        model,
        tokenizer_dir(config),
        min_pixels=e.image_min_pixels,
        max_pixels=e.image_max_pixels,
        weight_files=weight_files,
    )
    return model, vllm_engine(config, model_dir, version=version, max_total_tokens=e.max_total_tokens)


def worker_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike, worker_index: int) -> list[Task]:
    """A fleet worker's tasks (synthetic ones under WORKDIR/worker-I)."""
    return training_tasks(config, Path(workdir) / f"worker-{worker_index}")


def fleet_worker(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    worker_index: int,
    num_workers: int,
    *,
    sandboxes: SandboxSource,
    queue: TrajectoryQueue,
    log: Any = print,
) -> RolloutWorker:
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
        engine: Engine = ScriptedEngine(
            tokenizer, script_from_file(r.script_file), merge_size=model.vision.spatial_merge_size
        )
    elif r.engine == "jax":
        model, params = load_model(config)
        engine = jax_engine(
            config, model, params, tokenizer, version=0, max_total_tokens=config.episode.max_total_tokens
        )
    elif r.engine == "vllm":
        require_vllm()
        model, engine = _fleet_vllm_engine(config, queue, workdir / f"vllm-model-{worker_index}")
        watcher = HfTensorsWatcher
    else:
        raise ValueError(f"rollout.engine={r.engine!r}: a rollout worker runs 'jax', 'vllm' or 'scripted'")
    worker_config = WorkerConfig(
        worker_index=worker_index,
        num_workers=num_workers,
        seed=task_order_seed(config),
        stream=bool(r.worker_stream),
        max_staleness=r.max_staleness,
        max_epochs=r.max_epochs or None,
        poll_s=r.poll_s,
    )
    return RolloutWorker(
        worker_config,
        tasks=worker_tasks(config, workdir, worker_index),
        producer=producer(config, engine, tokenizer, sandboxes, episode_config(config, model)),
        queue=queue,
        weights=watcher(queue, engine, dtype=config.model.param_dtype),
        cursor=CursorFile(cursor_path(workdir, worker_index, num_workers)),
        log=log,
    )
