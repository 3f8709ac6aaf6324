"""The GRPO training loop: scored groups from a source -> oversample-filter-rank ->
advantages -> batch -> sharded step -> metrics -> checkpoint -> publish weights.

Each step runs generation rounds: a round collects `ceil(oversample * B)` scored groups from
the `GroupSource` and selection runs once over the pool of groups drawn this step; rounds
repeat while fewer than B groups are informative, at most `max_gen_rounds` times; then the
step trains on what exists (unselected slots are masked padding rows) and logs how many
groups it kept. The source's position is saved with each checkpoint, so a resumed run draws
what the run that never stopped would have. The trainer does not know the topology behind
the source (in-process, background thread or a fleet): the composition root
(`pyvision_jax.wiring`) builds it and hands over a `build_source(params)` callable.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.convert.run_layout import TRAJECTORY_SAMPLE
from pyvision_jax.models import ModelConfig, param_logical_axes
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.run_logs.metrics import format_console_line, format_validation_line
from pyvision_jax.run_logs.run_outputs import append_jsonl
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.broadcast_source import BroadcastSource
from pyvision_jax.train.groups import (
    GroupPool,
    SelectedRows,
    SelectionConfig,
    pool_arrays,
    rollout_scalars,
    select_rows,
)
from pyvision_jax.train.run_harness import RunHarness, RunSettings, TrainSummary
from pyvision_jax.train.source import GroupSource
from pyvision_jax.train.state import (
    OptimizerConfig,
    TrainState,
    init_train_state,
    make_optimizer,
    path_means,
    split_trainable,
    state_shardings,
)
from pyvision_jax.train.step import StepConfig, make_train_step
from pyvision_jax.train.validator import Validator


@dataclasses.dataclass(frozen=True)
class GrpoSettings:
    """Everything the GRPO loop needs to know, typed (the composition root builds it from the
    config's `train`, `rl` and `rollout` sections)."""

    run: RunSettings
    selection: SelectionConfig
    optimizer: OptimizerConfig
    step: StepConfig
    batching: BatchingConfig
    group_size: int
    prompts_per_round: int
    """Tasks drawn per generation round: ceil(oversample * B)."""
    max_gen_rounds: int = 1
    sample_groups_per_step: int = 0
    """Groups of each step appended to WORKDIR/trajectories.jsonl."""
    seed: int = 0

    def __post_init__(self) -> None:
        b = self.selection.batch_groups
        if b < 1 or self.group_size < 1 or self.max_gen_rounds < 1 or self.prompts_per_round < b:
            raise ValueError(
                f"rl.batch_groups ({b}), rl.group_size ({self.group_size}), rl.max_gen_rounds "
                f"({self.max_gen_rounds}) must be >= 1 and the tasks per round "
                f"({self.prompts_per_round}, rl.oversample * rl.batch_groups) >= rl.batch_groups"
            )


class Trainer:
    """Runs GRPO in `workdir`; resumes from the latest checkpoint there.

    `model` is the architecture, `param_shapes` its params as ShapeDtypeStructs,
    `load_params(shardings)` the initial params placed as given (called only when no
    checkpoint exists), and `build_source(params)` the `GroupSource` (called once, on process
    0 alone when there are several processes). `validator` (optional, single-process runs)
    evaluates the params at its steps (`train.validator`).
    """

    def __init__(
        self,
        settings: GrpoSettings,
        workdir: str | os.PathLike,
        *,
        model: ModelConfig,
        tokenizer: Any,
        param_shapes: Any,
        load_params: Callable[[Any], Any],
        build_source: Callable[[Any], GroupSource],
        progress: bool = True,
        log: Callable[[str], None] | None = None,
        validator: Validator | None = None,
    ):
        self.settings = settings
        self.validator = validator
        self.model_config = model
        self.tokenizer = tokenizer
        self._param_shapes, self._load_params, self._build_source = param_shapes, load_params, build_source
        self.harness = RunHarness(workdir, settings.run, progress=progress, log=log, jsonl_outputs=(TRAJECTORY_SAMPLE,))
        self.workdir = self.harness.workdir
        self.selection = settings.selection
        self.optimizer_config = settings.optimizer
        self.step_config = settings.step
        self.source: GroupSource | None = None
        self._receipts: list[Any] = []
        self._covered: list[Any] = []

    @property
    def log(self) -> Callable[[str], None]:
        return self.harness.log

    @property
    def checkpoints(self):
        return self.harness.checkpoints

    def request_stop(self) -> None:
        """Stop after the current round or step, saving a checkpoint (what SIGTERM does)."""
        self.harness.request_stop()

    # ------------------------------------------------------------------ setup

    def _setup(self) -> None:
        self.mesh = self.harness.open()
        self.primary = self.harness.primary
        frozen = self.optimizer_config.frozen_prefixes
        self.optimizer = make_optimizer(self.optimizer_config)
        init = functools.partial(
            init_train_state, optimizer=self.optimizer, seed=self.settings.seed, frozen_prefixes=frozen
        )
        abstract = jax.eval_shape(init, self._param_shapes)
        self.shardings = state_shardings(abstract, param_logical_axes(self.model_config), self.mesh)

        def fresh() -> TrainState:  # loaded and built sharded: no leaf or moment whole on one device
            return jax.jit(init, out_shardings=self.shardings)(self._load_params(self.shardings.params))

        self.state, cursors = self.harness.restore_or_init(abstract, self.shardings, fresh)
        if self.validator is not None:
            self.validator.forget_after(int(self.state.step))
        self.reference = self._reference()
        self.source = self._group_source()
        self.train_step = make_train_step(
            self.model_config,
            self.step_config,
            self.optimizer,
            self.mesh,
            self.shardings,
            donate=not self.source.holds_params,
        )
        self.shape_floor = BatchShape()  # the largest batch shape so far: shapes only grow (fewer compiles)
        self.source.start(self.state.params, int(self.state.step), cursors)
        self._source_state = self.source.state()

    def _reference(self) -> Any:
        """The trainable groups of the starting model (loaded again, so a resumed run measures
        its KL term against the same policy), when `rl.kl_coef` > 0; else None."""
        if not self.step_config.loss.kl_coef:
            return None
        params = self._load_params(self.shardings.params)
        return split_trainable(params, self.optimizer_config.frozen_prefixes)[0]

    def _group_source(self) -> GroupSource:
        """The source; with several processes, process 0 alone builds and runs it and every
        process gets its groups (`BroadcastSource`)."""
        if jax.process_count() > 1:
            return BroadcastSource(self._build_source)
        return self._build_source(self.state.params)

    def _acknowledge_covered(self) -> None:
        for receipt in self._covered:
            self.source.acknowledge(receipt)
        self._covered = []

    def _checkpoint(self, step: int, force: bool = False) -> None:
        """Saves when due; the groups of steps covered by a checkpoint are acknowledged to the
        source once that checkpoint is on disk (the next save's wait, or the end of the run)."""
        self.checkpoints.wait()
        self._acknowledge_covered()
        if (
            self.checkpoints.save(step, self.state, self._cursor_state(), force=force)
            or step in self.checkpoints.all_steps()
        ):
            self._covered, self._receipts = self._receipts, []

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainSummary:
        failed = True
        with self.harness.sigterm_stops():
            try:
                self._setup()
                first = int(self.state.step)
                self._validate(first)  # before training, or what a killed run left unfinished
                bar = self.harness.progress_bar(first, "train")
                try:
                    while int(self.state.step) < self.settings.run.steps and not self._stopping():
                        self._one_step(bar)
                finally:
                    bar.close()
                last = int(self.state.step)
                self._checkpoint(last, force=True)
                self.checkpoints.wait()
                self._acknowledge_covered()
                failed = False
                summary = self.harness.summary(first, last)
                if summary.interrupted:
                    self.log(
                        f"stopped after step {last}, checkpoint saved; rollouts in flight were abandoned "
                        "(a resumed run draws their tasks again)"
                    )
                return summary
            finally:
                self.harness.close((self.source,), quiet=failed)

    def _stopping(self) -> bool:
        return self.harness.stopping()

    def _cursor_state(self) -> dict[str, Any]:
        """The source's position as of the last completed step (tasks drawn by an interrupted
        step are drawn again after resuming, as the uninterrupted run would)."""
        return {**self._source_state, "step": int(self.state.step)}

    def _collect(self) -> tuple[GroupPool | None, SelectedRows | None, int, float]:
        """(the pool of groups drawn this step, its selection, generation rounds, seconds
        waiting for rollouts); selection runs once per round, over the stored scores."""
        s = self.settings
        capacity = s.prompts_per_round * s.max_gen_rounds
        groups: list[TrajectoryGroup] = []
        pool = selected = None
        waited, rounds = 0.0, 0
        for _ in range(s.max_gen_rounds):
            if self._stopping():
                break
            start = time.perf_counter()
            groups.extend(self.source.collect(s.prompts_per_round, self.harness.stop_event))
            waited += time.perf_counter() - start
            rounds += 1
            pool = pool_arrays(groups, capacity, s.group_size)
            selected = select_rows(pool, self.selection)
            if selected.full:
                break
        return pool, selected, rounds, waited

    def _one_step(self, bar: tqdm) -> None:
        s = self.settings
        batch_groups = s.selection.batch_groups
        step = int(self.state.step)
        pool, selected, rounds, waited = self._collect()
        if self._stopping() or pool is None or not pool.groups:
            return
        start = time.perf_counter()
        batch, stats = pack_batch(self.model_config, selected.rows, selected.advantages, s.batching, self.shape_floor)
        self.shape_floor = self.shape_floor.cover(stats.shape)
        self.state, out = self.train_step(self.state, shard_batch(batch, self.mesh), self.reference)
        out = jax.device_get(out)
        step_time = time.perf_counter() - start
        new_step = int(self.state.step)
        versions = [t.policy_version for t in selected.rows if t is not None]
        scalars = rollout_scalars(pool, selected.counts)
        scalars.update(
            {
                tags.ACTOR_ENTROPY: out["entropy"],
                tags.ACTOR_GRAD_NORM: out["grad_norm"],
                tags.ACTOR_CLIPFRAC: out["clip_fraction"],
                tags.ACTOR_APPROX_KL: out["approx_kl"],
                tags.ACTOR_REF_KL: out["ref_kl"],
                tags.ACTOR_IS_RATIO_MAX: out["is_ratio_max"],
                tags.ACTOR_IS_RATIO_MEAN: out["is_ratio_mean"],
                tags.PERF_STEP_TIME: step_time,
                tags.PERF_ROLLOUT_WAIT: waited,
                tags.PERF_TOKENS_PER_SEC: stats.real_tokens / max(step_time, 1e-9),
                tags.VERSION_STALENESS_MEAN: float(np.mean([step - v for v in versions])) if versions else 0.0,
                tags.VERSION_STALENESS_MAX: float(max([step - v for v in versions], default=0)),
                tags.ACTOR_LOSS: out["loss"],
                tags.ACTOR_LOSS_TOKENS: out["loss_tokens"],
                tags.ACTOR_TRAINED_TOKEN_FRAC: out["trained_token_fraction"],
                tags.ACTOR_UPDATED: out["updated"],
                tags.ACTOR_SKIPPED_NONFINITE: out["skipped_updates"],
                tags.FILTER_GEN_ROUNDS: rounds,
                tags.FILTER_GROUPS_DRAWN: len(pool.groups),
                tags.FILTER_ELIGIBLE: selected.counts.eligible,
                tags.BATCH_LENGTH: stats.length,
                tags.BATCH_REAL_TOKENS: stats.real_tokens,
                **{tags.SOURCE_STATS[name]: value for name, value in self.source.stats().items()},
                **{
                    tags.param_mean_tag(name): float(mean)
                    for name, mean in path_means(self.state.params, self.optimizer_config.uniform_updates).items()
                },
            }
        )
        self.harness.write_scalars(new_step, scalars)
        if self.primary:
            self._sample_trajectories(new_step, pool.groups)
        if not selected.full:
            self.log(
                f"step {new_step}: only {selected.counts.kept}/{batch_groups} informative groups "
                f"({selected.counts.available} trainable rollouts) after "
                f"{rounds} generation round(s) (rl.max_gen_rounds={s.max_gen_rounds}); "
                f"trained on them with the rest masked"
            )
        self.log(format_console_line(new_step, scalars, s.run.steps))
        bar.update(1)
        self._source_state = self.source.state()
        self._receipts.append(self.source.receipt())
        self._checkpoint(new_step)
        self.source.publish(self.state.params, new_step, final=new_step >= s.run.steps)
        self._validate(new_step)

    def _validate(self, step: int) -> None:
        """Validates the params of `step` when the validator has it pending, after a
        checkpoint of that step is on disk (a run killed meanwhile resumes here and finishes
        this validation instead of training the step again)."""
        if self.validator is None or not self.validator.pending(step) or self._stopping():
            return
        if step:
            self._checkpoint(step, force=True)
            self.checkpoints.wait()
        scalars = self.validator.validate(self.state.params, step)
        self.log(format_validation_line(step, scalars))

    def _sample_trajectories(self, step: int, pool: Sequence[TrajectoryGroup]) -> None:
        count = self.settings.sample_groups_per_step
        if count <= 0:
            return
        append_jsonl(
            self.workdir / TRAJECTORY_SAMPLE,
            [{"step": step, "group": json.loads(group.to_json(None))} for group in pool[:count]],
        )
