"""The GRPO training loop: rollouts -> score -> oversample-filter-rank -> advantages ->
batch -> sharded step -> metrics -> checkpoint -> publish weights.

Rollout modes (`rollout.mode`):
- "sync": generate then train (on-policy, the paper's setting). Each round draws
  `ceil(oversample * B)` tasks, runs G episodes each with the in-process engine, passes the
  groups through the trajectory queue, and selection runs over every group drawn this step.
  Rounds repeat while fewer than B groups are informative, at most `rl.max_gen_rounds`
  times; then the step trains on what exists (unselected slots are masked padding rows) and
  logs how many groups it kept. Sampling seeds derive from (seed, step, round) and tasks are
  drawn in a seeded order from a cursor saved with each checkpoint, so a resumed run
  reproduces the run that never stopped.
- "async": a rollout thread keeps generating ahead into the queue; the queue admits groups at
  most `rollout.max_staleness` versions old; the thread loads new weights between rounds.
- "external": a fleet (e.g. vLLM workers, `launch/rollout_worker.py`) fills the queue; the
  trainer publishes weights (versioned HF safetensors directories, `WeightsPublisher`) every
  `rollout.publish_every` steps and announces them on the queue; groups a restarted worker
  delivers twice are dropped by key (`DeliveredGroups`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from pyvision_jax.agent.episode import EpisodeRunner
from pyvision_jax.data.tasks import Task
from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.models import ModelConfig, param_logical_axes
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.agent.engine import Engine, SamplingParams
from pyvision_jax.rollout.queue import QueueConfig, QueueFullError, TrajectoryQueue, make_queue
from pyvision_jax.rollout.setup import build_engine, episode_config, load_model, load_tokenizer, training_tasks
from pyvision_jax.train import metrics as names
from pyvision_jax.train.batching import BatchingConfig, pack_batch, parse_buckets
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.groups import ScoredGroups, SelectedRows, rollout_scalars, score_groups, select_rows
from pyvision_jax.train.mesh import mesh_from_config
from pyvision_jax.train.metrics import MetricsWriter, format_console_line
from pyvision_jax.train.state import OptimizerConfig, TrainState, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, make_train_step, shard_batch

MODES = ("sync", "async", "external")
CHECKPOINT_DIR, TB_DIR = "checkpoints", "tb"
TRAJECTORY_SAMPLE, RESOLVED_CONFIG = "trajectories.jsonl", "config.json"


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """What a run did and where its outputs are."""

    first_step: int
    last_step: int
    interrupted: bool
    checkpoint_dir: str
    tensorboard_dir: str
    workdir: str


class TaskStream:
    """Tasks in a seeded order, epoch after epoch, from a cursor (the number drawn so far)."""

    def __init__(self, tasks: Sequence[Task], seed: int, cursor: int = 0):
        if not tasks:
            raise ValueError("no training tasks (data.train_files is empty and no synthetic kinds?)")
        self.tasks = tuple(tasks)
        self.seed = seed
        self.cursor = cursor

    def draw(self, count: int) -> list[Task]:
        out = []
        for _ in range(count):
            epoch, position = divmod(self.cursor, len(self.tasks))
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))
            out.append(self.tasks[order[position]])
            self.cursor += 1
        return out


def rollout_seed(seed: int, step: int, round_index: int) -> int:
    """The sampling seed of one generation round."""
    return int(np.random.SeedSequence([seed, step, round_index]).generate_state(1)[0] % (2**31))


class _RolloutThread(threading.Thread):
    """Async mode: generates groups into the queue until stopped; loads published weights."""

    def __init__(self, make_runner: Callable[[int], EpisodeRunner], engine: Engine, stream: TaskStream,
                 queue: TrajectoryQueue, prompts: int, group_size: int):
        super().__init__(name="rollout-worker", daemon=True)
        self.make_runner, self.engine, self.stream, self.queue = make_runner, engine, stream, queue
        self.prompts, self.group_size = prompts, group_size
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self._weights_lock = threading.Lock()
        self._weights: tuple[Any, int] | None = None
        self._round = 0

    def publish(self, params: Any, version: int) -> None:
        with self._weights_lock:
            self._weights = (params, version)

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                with self._weights_lock:
                    weights, self._weights = self._weights, None
                if weights is not None:
                    self.engine.update_weights(*weights)
                groups = self.make_runner(self._round).run(self.stream.draw(self.prompts), self.group_size)
                self._round += 1
                for group in groups:
                    while not self.stop_event.is_set():
                        try:
                            self.queue.put(group.to_bytes(), version=self.engine.version, timeout=1.0)
                            break
                        except QueueFullError:
                            continue
        except BaseException as error:  # surfaced by the trainer
            self.error = error


class Trainer:
    """Runs `config` in `workdir`; resumes from the latest checkpoint there.

    `model` ((ModelConfig, initial params)), `engine`, `tokenizer`, `sandboxes` and `tasks`
    replace what the config would build (tests pass a scripted engine or a fake sandbox pool).
    """

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                 model: tuple[ModelConfig, Any] | None = None, engine: Engine | None = None,
                 tokenizer: Any = None, sandboxes: Any = None, tasks: Sequence[Task] | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None):
        self.config = config
        self.workdir = Path(workdir).absolute()
        self._model, self._engine, self._tokenizer = model, engine, tokenizer
        self._sandboxes, self._tasks = sandboxes, tasks
        self.progress = progress
        self.log = log or (lambda line: tqdm.write(line))
        self._stop = threading.Event()
        c = config
        if c.rollout.mode not in MODES:
            raise ValueError(f"rollout.mode={c.rollout.mode!r} must be one of {MODES}")
        if c.rl.batch_groups < 1 or c.rl.group_size < 1 or c.rl.max_gen_rounds < 1 or c.rl.oversample < 1:
            raise ValueError(f"rl.batch_groups ({c.rl.batch_groups}), rl.group_size ({c.rl.group_size}), "
                             f"rl.max_gen_rounds ({c.rl.max_gen_rounds}) must be >= 1 and rl.oversample "
                             f"({c.rl.oversample}) >= 1")

    def request_stop(self) -> None:
        """Stop after the current round or step, saving a checkpoint (what SIGTERM does)."""
        self._stop.set()

    # ------------------------------------------------------------------ setup

    def _setup(self) -> None:
        c = self.config
        for sub in (CHECKPOINT_DIR, TB_DIR):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        (self.workdir / RESOLVED_CONFIG).write_text(c.to_json_best_effort(indent=2, sort_keys=True))
        self.tokenizer = self._tokenizer or load_tokenizer(c)
        self.model_config, params = self._model or load_model(c)
        self.mesh = mesh_from_config(c.train)
        frozen = ("visual",) if c.train.freeze_vision else ()
        self.optimizer = make_optimizer(OptimizerConfig(
            lr=c.train.lr, b1=c.train.b1, b2=c.train.b2, weight_decay=c.train.weight_decay,
            grad_clip=c.train.grad_clip, schedule=c.train.schedule, warmup_steps=c.train.warmup_steps,
            total_steps=c.train.steps, frozen_prefixes=frozen))
        init = functools.partial(init_train_state, optimizer=self.optimizer, seed=c.seed, frozen_prefixes=frozen)
        abstract = jax.eval_shape(init, params)
        self.shardings = state_shardings(abstract, param_logical_axes(self.model_config), self.mesh)
        self.checkpoints = TrainCheckpoints(self.workdir / CHECKPOINT_DIR, c.train.checkpoint_every,
                                            c.train.keep_checkpoints)
        self.cursors: dict[str, Any] = {"tasks_drawn": 0}
        if self.checkpoints.latest_step() is not None:
            state, self.cursors = self.checkpoints.restore(abstract, self.shardings)
            self.log(f"resumed from {self.checkpoints.directory} at step {int(state.step)}")
        else:  # built sharded: optimizer moments never exist unsharded on one device
            state = jax.jit(init, out_shardings=self.shardings)(jax.device_put(params, self.shardings.params))
        del params
        self.state: TrainState = state
        loss = PPOLossConfig(eps_low=c.rl.eps_low, eps_high=c.rl.eps_high,
                             dual_clip=c.rl.dual_clip if c.rl.dual_clip else None, aggregation=c.rl.loss_agg,
                             kl_coef=c.rl.kl_coef, entropy_coef=c.rl.entropy_coef)
        self.step_config = StepConfig(loss=loss, temperature=c.rollout.temperature,
                                      logprob_chunk=c.train.logprob_chunk, old_logprobs=c.train.old_logprobs,
                                      compute_dtype=c.model.compute_dtype, frozen_prefixes=frozen)
        in_process = c.rollout.mode != "external"
        self.train_step = make_train_step(self.model_config, self.step_config, self.optimizer, self.mesh,
                                          self.shardings, donate=not in_process)
        self.batching = BatchingConfig(parse_buckets(c.train.length_buckets), c.train.micro_batch)
        self.episode = episode_config(c, self.model_config)
        queue_max_staleness = None if c.rollout.mode == "sync" else c.rollout.max_staleness
        self.queue = make_queue(QueueConfig(backend=c.rollout.queue, max_backlog=c.rollout.max_backlog,
                                            max_staleness=queue_max_staleness, redis_url=c.rollout.redis_url,
                                            namespace=c.rollout.queue_namespace),
                                decode=TrajectoryGroup.from_bytes)
        self.queue.set_trainer_version(int(self.state.step))
        self.engine = None
        self.sandboxes = None
        self._own_sandboxes = False
        if in_process:
            self.engine = self._engine or build_engine(c, self.model_config, self.state.params, self.tokenizer,
                                                       int(self.state.step))
            self.engine.update_weights(self.state.params, int(self.state.step))
            self.stream = TaskStream(self._tasks if self._tasks is not None else training_tasks(c, self.workdir),
                                     c.data.synthetic_seed + c.seed, int(self.cursors.get("tasks_drawn", 0)))
            self.sandboxes = self._sandboxes
            if self.sandboxes is None:
                from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
                self.sandboxes = SandboxPool(SandboxConfig(timeout_s=c.sandbox.timeout_s,
                                                           allow_unisolated=c.sandbox.allow_unisolated),
                                             size=c.sandbox.pool_size)
                self._own_sandboxes = True
        self.publisher = self.delivered = None
        if not in_process:
            from pyvision_jax.rollout.weights import WeightsPublisher
            from pyvision_jax.rollout.worker import DeliveredGroups
            self.publisher = WeightsPublisher(c.rollout.weights_dir or self.workdir / "weights", self.model_config,
                                              queue=self.queue, dtype=c.model.param_dtype)
            self.delivered = DeliveredGroups(c.rollout.redis_url if c.rollout.queue == "redis" else None)
            self.publisher.publish(int(self.state.step), jax.device_get(self.state.params))
        self._completed_cursor = int(self.cursors.get("tasks_drawn", 0))
        self.writer = MetricsWriter(self.workdir / TB_DIR)
        self.worker: _RolloutThread | None = None
        if c.rollout.mode == "async":
            self.worker = _RolloutThread(lambda r: self._runner(int(self.state.step), 10_000 + r), self.engine,
                                         self.stream, self.queue, self.prompts_per_round, c.rl.group_size)
            self.worker.start()

    @property
    def prompts_per_round(self) -> int:
        return math.ceil(self.config.rl.oversample * self.config.rl.batch_groups)

    def _runner(self, step: int, round_index: int) -> EpisodeRunner:
        r = self.config.rollout
        sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                  seed=rollout_seed(self.config.seed, step, round_index))
        return EpisodeRunner(self.engine, self.tokenizer, self.sandboxes, self.episode, sampling)

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainSummary:
        previous_handler = None
        if threading.current_thread() is threading.main_thread():
            previous_handler = signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        try:
            self._setup()
            first = int(self.state.step)
            total = self.config.train.steps
            bar = tqdm(total=total, initial=min(first, total), desc="train", unit="step",
                       disable=not self.progress, dynamic_ncols=True)
            try:
                while int(self.state.step) < total and not self._stop.is_set():
                    self._one_step(bar)
            finally:
                bar.close()
            last = int(self.state.step)
            self.checkpoints.save(last, self.state, self._cursor_state(), force=True)
            return TrainSummary(first, last, self._stop.is_set() and last < total, self.checkpoints.directory,
                                self.writer.logdir if hasattr(self, "writer") else "", str(self.workdir))
        finally:
            self._close()
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)

    def _cursor_state(self) -> dict[str, Any]:
        """Cursors as of the last completed step (tasks drawn by an interrupted step are
        drawn again after resuming, as the uninterrupted run would)."""
        return {"tasks_drawn": self._completed_cursor, "step": int(self.state.step)}

    def _close(self) -> None:
        if getattr(self, "worker", None) is not None:
            self.worker.stop_event.set()
            self.worker.join(timeout=600)
        if getattr(self, "checkpoints", None) is not None:
            self.checkpoints.close()
        if getattr(self, "writer", None) is not None:
            self.writer.close()
        if getattr(self, "delivered", None) is not None:
            self.delivered.close()
        if getattr(self, "queue", None) is not None:
            self.queue.close()
        if self._own_sandboxes and self.sandboxes is not None:
            self.sandboxes.close()

    def _collect(self, step: int) -> tuple[list[TrajectoryGroup], int, float]:
        """(groups drawn this step, generation rounds, seconds spent waiting for rollouts)."""
        c = self.config
        prompts, group_size, batch_groups = self.prompts_per_round, c.rl.group_size, c.rl.batch_groups
        pool: list[TrajectoryGroup] = []
        waited = 0.0
        rounds = 0
        for round_index in range(c.rl.max_gen_rounds):
            if self._stop.is_set():
                break
            start = time.perf_counter()
            if c.rollout.mode == "sync":
                groups = self._runner(step, round_index).run(self.stream.draw(prompts), group_size)
                for group in groups:
                    self.queue.put(group.to_bytes(), version=self.engine.version)
            pool.extend(self._take(prompts))
            waited += time.perf_counter() - start
            rounds += 1
            if self._select(pool)[1].counts.eligible >= batch_groups:
                break
        return pool, rounds, waited

    def _select(self, pool: Sequence[TrajectoryGroup]) -> tuple[ScoredGroups, SelectedRows]:
        c = self.config
        capacity = self.prompts_per_round * c.rl.max_gen_rounds
        scored = score_groups(pool, c.rl.group_size, capacity, self.tokenizer, c.rl.tool_reward_coef)
        return scored, select_rows(scored, c.rl.batch_groups, c.rl.group_size, mode=c.rl.selection_mode,
                                   min_members=c.rl.min_members, drop_groups_with_broken=c.rl.drop_groups_with_broken,
                                   normalize_std=c.rl.normalize_std)

    def _take(self, count: int) -> list[TrajectoryGroup]:
        taken: list[TrajectoryGroup] = []
        timeout = self.config.rollout.wait_timeout_s
        deadline = time.monotonic() + timeout
        while len(taken) < count:
            if self.worker is not None and self.worker.error is not None:
                raise RuntimeError("the rollout worker failed") from self.worker.error
            if self._stop.is_set() and self.config.rollout.mode != "sync":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no trajectory groups for {timeout} s (rollout.wait_timeout_s); "
                                   f"are the rollout workers running?")
            items = self.queue.get(max_groups=count - len(taken), timeout=1.0)
            self.queue.ack([item.id for item in items])
            taken.extend(item.obj for item in items
                         if self.delivered is None or self.delivered.first(item.obj))
        return taken

    def _one_step(self, bar: tqdm) -> None:
        c = self.config
        step = int(self.state.step)
        pool, rounds, waited = self._collect(step)
        if self._stop.is_set() or not pool:
            return
        scored, selected = self._select(pool)
        start = time.perf_counter()
        batch, stats = pack_batch(self.model_config, selected.rows, selected.advantages, self.batching)
        self.state, out = self.train_step(self.state, shard_batch(batch, self.mesh))
        out = jax.device_get(out)
        step_time = time.perf_counter() - start
        new_step = int(self.state.step)
        versions = [t.policy_version for t in selected.rows if t is not None]
        scalars = rollout_scalars(scored, selected.counts)
        scalars.update({
            names.ACTOR_ENTROPY: out["entropy"], names.ACTOR_GRAD_NORM: out["grad_norm"],
            names.ACTOR_CLIPFRAC: out["clip_fraction"], names.ACTOR_APPROX_KL: out["approx_kl"],
            names.ACTOR_IS_RATIO_MAX: out["is_ratio_max"], names.PERF_STEP_TIME: step_time,
            names.PERF_ROLLOUT_WAIT: waited, names.PERF_TOKENS_PER_SEC: stats.real_tokens / max(step_time, 1e-9),
            names.VERSION_STALENESS_MEAN: float(np.mean([step - v for v in versions])) if versions else 0.0,
            "actor/loss": out["loss"], "actor/loss_tokens": out["loss_tokens"], "actor/updated": out["updated"],
            "actor/skipped_nonfinite": out["skipped_updates"], "filter/gen_rounds": rounds,
            "filter/groups_drawn": len(pool), "filter/eligible": selected.counts.eligible,
            "batch/length": stats.length, "batch/real_tokens": stats.real_tokens,
        })
        self.writer.write(new_step, scalars)
        self.writer.flush()
        self._sample_trajectories(new_step, pool)
        if selected.counts.kept < c.rl.batch_groups:
            self.log(f"step {new_step}: only {selected.counts.kept}/{c.rl.batch_groups} informative groups after "
                     f"{rounds} generation round(s) (rl.max_gen_rounds={c.rl.max_gen_rounds}); "
                     f"trained on them with the rest masked")
        self.log(format_console_line(new_step, scalars, c.train.steps))
        bar.update(1)
        if getattr(self, "stream", None) is not None:
            self._completed_cursor = self.stream.cursor
        self.checkpoints.save(new_step, self.state, self._cursor_state())
        self._publish(new_step)

    def _publish(self, version: int) -> None:
        c = self.config
        self.queue.set_trainer_version(version)
        if c.rollout.mode == "sync":
            self.engine.update_weights(self.state.params, version)
        elif c.rollout.mode == "async":
            self.worker.publish(self.state.params, version)
        elif version % c.rollout.publish_every == 0 or version == c.train.steps:
            self.publisher.publish(version, jax.device_get(self.state.params))

    def _sample_trajectories(self, step: int, pool: Sequence[TrajectoryGroup]) -> None:
        count = self.config.train.sample_groups_per_step
        if count <= 0:
            return
        with open(self.workdir / TRAJECTORY_SAMPLE, "a") as out:
            for group in pool[:count]:
                out.write(json.dumps({"step": step, "group": json.loads(group.to_json(None))}) + "\n")


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs: Any) -> TrainSummary:
    """Runs (or resumes) training; see `Trainer`."""
    return Trainer(config, workdir, **kwargs).run()
