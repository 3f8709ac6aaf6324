"""The GRPO training loop: scored groups from a source -> oversample-filter-rank ->
advantages -> batch -> sharded step -> metrics -> checkpoint -> publish weights.

Each step runs generation rounds: a round collects `ceil(oversample * B)` scored groups from
the `GroupSource` and selection runs once over the pool of groups drawn this step; rounds
repeat while fewer than B groups are informative, at most `rl.max_gen_rounds` times; then the
step trains on what exists (unselected slots are masked padding rows) and logs how many
groups it kept. The source's position is saved with each checkpoint, so a resumed run draws
what the run that never stopped would have. The trainer does not know the topology behind
the source (in-process, background thread or a fleet; `wiring.group_source` picks it).
"""
from __future__ import annotations

import dataclasses
import functools
import json
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

from pyvision_jax import wiring
from pyvision_jax.agent.engine import Engine
from pyvision_jax.agent.runner import SandboxSource
from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig, param_logical_axes
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.train import metric_names as tags
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.groups import GroupPool, SelectedRows, SelectionConfig, pool_arrays, rollout_scalars, select_rows
from pyvision_jax.train.broadcast_source import BroadcastSource
from pyvision_jax.train.mesh import distributed_from_config, mesh_from_config
from pyvision_jax.train.multihost import agree, is_primary
from pyvision_jax.train.run_outputs import append_jsonl, truncate_events, truncate_jsonl
from pyvision_jax.train.metrics import MetricsWriter, format_console_line
from pyvision_jax.train.source import GroupSource
from pyvision_jax.train.state import (OptimizerConfig, TrainState, init_train_state, make_optimizer, path_means,
                                      state_shardings)
from pyvision_jax.train.step import StepConfig, make_train_step, shard_batch

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


class Trainer:
    """Runs `config` in `workdir`; resumes from the latest checkpoint there.

    `model` ((ModelConfig, initial params)) and `tokenizer` replace what the config would
    build; `engine`, `sandboxes` and `tasks` go to `wiring.group_source` (tests pass a
    scripted engine or a fake sandbox pool); `source` replaces the config's source whole.
    """

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                 model: tuple[ModelConfig, Any] | None = None, tokenizer: Any = None,
                 engine: Engine | None = None, sandboxes: SandboxSource | None = None,
                 tasks: Sequence[Task] | None = None, source: GroupSource | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None):
        self.config = config
        self.workdir = Path(workdir).absolute()
        self._model, self._tokenizer = model, tokenizer
        self._source_parts = {"engine": engine, "sandboxes": sandboxes, "tasks": tasks}
        self.source: GroupSource | None = source
        self.progress = progress
        self.log = log or (lambda line: tqdm.write(line))
        self._stop = threading.Event()
        c = config
        if c.rl.batch_groups < 1 or c.rl.group_size < 1 or c.rl.max_gen_rounds < 1 or c.rl.oversample < 1:
            raise ValueError(f"rl.batch_groups ({c.rl.batch_groups}), rl.group_size ({c.rl.group_size}), "
                             f"rl.max_gen_rounds ({c.rl.max_gen_rounds}) must be >= 1 and rl.oversample "
                             f"({c.rl.oversample}) >= 1")
        self.prompts_per_round = wiring.prompts_per_round(c)
        self.selection = SelectionConfig.from_config(c.rl)
        self.checkpoints: TrainCheckpoints | None = None
        self.writer: MetricsWriter | None = None
        self._receipts: list[Any] = []
        self._covered: list[Any] = []
        self.primary = True

    def request_stop(self) -> None:
        """Stop after the current round or step, saving a checkpoint (what SIGTERM does)."""
        self._stop.set()

    # ------------------------------------------------------------------ setup

    def _setup(self) -> None:
        c = self.config
        distributed_from_config(c.train)  # before any other JAX call of this process
        self.primary = is_primary()
        if not self.primary:  # process 0 alone logs and writes the run's files
            self.log, self.progress = (lambda line: None), False
        for sub in (CHECKPOINT_DIR, TB_DIR):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        if self.primary:
            (self.workdir / RESOLVED_CONFIG).write_text(c.to_json_best_effort(indent=2, sort_keys=True))
        self.tokenizer = self._tokenizer or wiring.load_tokenizer(c)
        self.mesh = mesh_from_config(c.train)
        self.model_config = self._model[0] if self._model else wiring.model_config(c)
        shapes = jax.eval_shape(lambda: self._model[1]) if self._model else wiring.param_shapes(c, self.model_config)
        frozen = ("visual",) if c.train.freeze_vision else ()
        self.optimizer_config = OptimizerConfig.from_config(c.train, frozen_prefixes=frozen)
        self.optimizer = make_optimizer(self.optimizer_config)
        init = functools.partial(init_train_state, optimizer=self.optimizer, seed=c.seed, frozen_prefixes=frozen)
        abstract = jax.eval_shape(init, shapes)
        self.shardings = state_shardings(abstract, param_logical_axes(self.model_config), self.mesh)
        self.checkpoints = TrainCheckpoints(self.workdir / CHECKPOINT_DIR, c.train.checkpoint_every,
                                            c.train.keep_checkpoints)
        cursors: dict[str, Any] = {}
        if self.checkpoints.latest_step() is not None:
            _, state, cursors = self.checkpoints.restore_intact(abstract, self.shardings, warn=self.log)
            self.log(f"resumed from {self.checkpoints.directory} at step {int(state.step)}")
        else:  # loaded and built sharded: no leaf or optimizer moment whole on one device
            params = (jax.device_put(self._model[1], self.shardings.params) if self._model
                      else wiring.load_model(c, sharding=self.shardings.params)[1])
            state = jax.jit(init, out_shardings=self.shardings)(params)
            del params
        self.state: TrainState = state
        self.source = self._group_source()
        self.step_config = StepConfig(loss=PPOLossConfig.from_config(c.rl), temperature=c.rollout.temperature,
                                      logprob_chunk=c.train.logprob_chunk, old_logprobs=c.train.old_logprobs,
                                      ppo_epochs=c.train.ppo_epochs, compute_dtype=c.model.compute_dtype, frozen_prefixes=frozen,
                                      remat=c.model.remat)
        self.train_step = make_train_step(self.model_config, self.step_config, self.optimizer, self.mesh,
                                          self.shardings, donate=not self.source.holds_params)
        self.batching = BatchingConfig(wiring.int_tuple(c.train.length_buckets, "train.length_buckets"),
                                       c.train.micro_batch, c.train.pack)
        self.shape_floor = BatchShape()  # the largest batch shape so far: shapes only grow (fewer compiles)
        if self.primary:
            self._drop_outputs_after(int(self.state.step))
            self.writer = MetricsWriter(self.workdir / TB_DIR)
        self.source.start(self.state.params, int(self.state.step), cursors)
        self._source_state = self.source.state()

    def _group_source(self) -> GroupSource:
        """The given source or the config's; with several processes, process 0 alone runs it
        and every process gets its groups (`BroadcastSource`)."""
        given = self.source

        def build(params: Any) -> GroupSource:
            return given or wiring.group_source(self.config, self.workdir, self.model_config, params,
                                                self.tokenizer, **self._source_parts)

        if jax.process_count() > 1:
            return BroadcastSource(build)
        return build(self.state.params)

    def _drop_outputs_after(self, step: int) -> None:
        """A resumed (or restarted) run redoes the steps after `step`: what a killed run wrote
        for them goes first, so every step appears once in TensorBoard and the sample."""
        dropped = truncate_events(self.workdir / TB_DIR, step) + truncate_jsonl(self.workdir / TRAJECTORY_SAMPLE, step)
        if dropped:
            self.log(f"removed {dropped} TensorBoard events / sample records of steps after {step} (redone now)")

    def _acknowledge_covered(self) -> None:
        for receipt in self._covered:
            self.source.acknowledge(receipt)
        self._covered = []

    def _checkpoint(self, step: int, force: bool = False) -> None:
        """Saves when due; the groups of steps covered by a checkpoint are acknowledged to the
        source once that checkpoint is on disk (the next save's wait, or the end of the run)."""
        self.checkpoints.wait()
        self._acknowledge_covered()
        if self.checkpoints.save(step, self.state, self._cursor_state(), force=force) or \
                step in self.checkpoints.all_steps():
            self._covered, self._receipts = self._receipts, []

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainSummary:
        previous_handler = None
        if threading.current_thread() is threading.main_thread():
            previous_handler = signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        failed = True
        try:
            self._setup()
            first = int(self.state.step)
            total = self.config.train.steps
            bar = tqdm(total=total, initial=min(first, total), desc="train", unit="step",
                       disable=not self.progress, dynamic_ncols=True)
            try:
                while int(self.state.step) < total and not self._stopping():
                    self._one_step(bar)
            finally:
                bar.close()
            last = int(self.state.step)
            self._checkpoint(last, force=True)
            self.checkpoints.wait()
            self._acknowledge_covered()
            failed = False
            return TrainSummary(first, last, self._stopping() and last < total, self.checkpoints.directory,
                                str(self.workdir / TB_DIR), str(self.workdir))
        finally:
            self._close(quiet=failed)
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)

    def _stopping(self) -> bool:
        """Whether the run stops (SIGTERM, `request_stop`); with several processes, process
        0's answer, so that all of them take the same path."""
        return agree(self._stop.is_set())

    def _cursor_state(self) -> dict[str, Any]:
        """The source's position as of the last completed step (tasks drawn by an interrupted
        step are drawn again after resuming, as the uninterrupted run would)."""
        return {**self._source_state, "step": int(self.state.step)}

    def _close(self, quiet: bool) -> None:
        """Closes everything; with `quiet` (the run is failing already) a close error is one
        logged line, so the run's own error stays the one reported."""
        errors = []
        for resource in (self.source, self.checkpoints, self.writer):
            if resource is None:
                continue
            try:
                resource.close()
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)
        for error in errors[1 if not quiet else 0:]:
            self.log(f"while closing: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        if errors and not quiet:
            raise errors[0]

    def _collect(self) -> tuple[GroupPool | None, SelectedRows | None, int, float]:
        """(the pool of groups drawn this step, its selection, generation rounds, seconds
        waiting for rollouts); selection runs once per round, over the stored scores."""
        c = self.config
        capacity = self.prompts_per_round * c.rl.max_gen_rounds
        groups: list[TrajectoryGroup] = []
        pool = selected = None
        waited, rounds = 0.0, 0
        for _ in range(c.rl.max_gen_rounds):
            if self._stopping():
                break
            start = time.perf_counter()
            groups.extend(self.source.collect(self.prompts_per_round, self._stop))
            waited += time.perf_counter() - start
            rounds += 1
            pool = pool_arrays(groups, capacity, c.rl.group_size)
            selected = select_rows(pool, self.selection)
            if selected.counts.eligible >= c.rl.batch_groups:
                break
        return pool, selected, rounds, waited

    def _one_step(self, bar: tqdm) -> None:
        c = self.config
        step = int(self.state.step)
        pool, selected, rounds, waited = self._collect()
        if self._stopping() or pool is None or not pool.groups:
            return
        start = time.perf_counter()
        batch, stats = pack_batch(self.model_config, selected.rows, selected.advantages, self.batching,
                                  self.shape_floor)
        self.shape_floor = self.shape_floor.cover(stats.shape)
        self.state, out = self.train_step(self.state, shard_batch(batch, self.mesh))
        out = jax.device_get(out)
        step_time = time.perf_counter() - start
        new_step = int(self.state.step)
        versions = [t.policy_version for t in selected.rows if t is not None]
        scalars = rollout_scalars(pool, selected.counts)
        scalars.update({
            tags.ACTOR_ENTROPY: out["entropy"], tags.ACTOR_GRAD_NORM: out["grad_norm"],
            tags.ACTOR_CLIPFRAC: out["clip_fraction"], tags.ACTOR_APPROX_KL: out["approx_kl"],
            tags.ACTOR_IS_RATIO_MAX: out["is_ratio_max"], tags.ACTOR_IS_RATIO_MEAN: out["is_ratio_mean"],
            tags.PERF_STEP_TIME: step_time,
            tags.PERF_ROLLOUT_WAIT: waited, tags.PERF_TOKENS_PER_SEC: stats.real_tokens / max(step_time, 1e-9),
            tags.VERSION_STALENESS_MEAN: float(np.mean([step - v for v in versions])) if versions else 0.0,
            tags.VERSION_STALENESS_MAX: float(max([step - v for v in versions], default=0)),
            tags.ACTOR_LOSS: out["loss"], tags.ACTOR_LOSS_TOKENS: out["loss_tokens"],
            tags.ACTOR_TRAINED_TOKEN_FRAC: out["trained_token_fraction"],
            tags.ACTOR_UPDATED: out["updated"], tags.ACTOR_SKIPPED_NONFINITE: out["skipped_updates"],
            tags.FILTER_GEN_ROUNDS: rounds, tags.FILTER_GROUPS_DRAWN: len(pool.groups),
            tags.FILTER_ELIGIBLE: selected.counts.eligible, tags.BATCH_LENGTH: stats.length,
            tags.BATCH_REAL_TOKENS: stats.real_tokens,
            **{tags.SOURCE_STATS[name]: value for name, value in self.source.stats().items()},
            **{tags.param_mean_tag(name): float(mean) for name, mean
               in path_means(self.state.params, self.optimizer_config.uniform_updates).items()},
        })
        if self.primary:
            self.writer.write(new_step, scalars)
            self.writer.flush()
            self._sample_trajectories(new_step, pool.groups)
        if selected.counts.kept < c.rl.batch_groups:
            self.log(f"step {new_step}: only {selected.counts.kept}/{c.rl.batch_groups} informative groups after "
                     f"{rounds} generation round(s) (rl.max_gen_rounds={c.rl.max_gen_rounds}); "
                     f"trained on them with the rest masked")
        self.log(format_console_line(new_step, scalars, c.train.steps))
        bar.update(1)
        self._source_state = self.source.state()
        self._receipts.append(self.source.receipt())
        self._checkpoint(new_step)
        self.source.publish(self.state.params, new_step, final=new_step >= c.train.steps)

    def _sample_trajectories(self, step: int, pool: Sequence[TrajectoryGroup]) -> None:
        count = self.config.train.sample_groups_per_step
        if count <= 0:
            return
        append_jsonl(self.workdir / TRAJECTORY_SAMPLE,
                     [{"step": step, "group": json.loads(group.to_json(None))} for group in pool[:count]])


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs: Any) -> TrainSummary:
    """Runs (or resumes) training; see `Trainer`."""
    return Trainer(config, workdir, **kwargs).run()
