"""The SFT loop: batches of rendered samples -> sharded SFT step -> metrics -> checkpoints,
and at the end the weights as an HF safetensors directory (what GRPO starts from).

The workdir layout is the GRPO trainer's (checkpoints/, tb/, config.json; the shared
`run_harness`) plus sft_data/ (synthetic data) and the export directory. Rerunning resumes
from the latest readable checkpoint; batches depend only on the step, so the resumed run
trains on what the uninterrupted one would have. SIGTERM saves and stops. With several
`jax.distributed` processes every process trains on the same batches (sharded over the
global mesh) and process 0 alone writes the run's files and the export.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from pyvision_jax.convert import save_hf
from pyvision_jax.models import ModelConfig, param_logical_axes
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.multihost import gather_to_host
from pyvision_jax.train.run_harness import RunHarness, RunSettings, TrainSummary
from pyvision_jax.train.sft_data import SftSamples, batch_indices
from pyvision_jax.train.sft_step import make_sft_step
from pyvision_jax.train.state import OptimizerConfig, TrainState, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig


@dataclasses.dataclass(frozen=True)
class SftSettings:
    """The SFT loop's settings (built from the config's `sft` and `train` sections)."""

    run: RunSettings
    optimizer: OptimizerConfig
    step: StepConfig
    batching: BatchingConfig
    batch_size: int
    export_dir: Path
    """Where the final weights go (HF safetensors)."""
    export_dtype: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"sft.batch_size must be >= 1, got {self.batch_size}")


def _console_line(step: int, total: int, scalars: dict[str, float]) -> str:
    return (
        f"step {step}/{total} | loss {scalars[tags.SFT_LOSS]:.4f} | tokens {scalars[tags.SFT_LOSS_TOKENS]:.0f}"
        f" | gnorm {scalars[tags.ACTOR_GRAD_NORM]:.3g} | step_s {scalars[tags.PERF_STEP_TIME]:.2f}"
    )


def train_sft(
    settings: SftSettings,
    workdir: str | os.PathLike,
    *,
    model: ModelConfig,
    params: Any,
    load_samples: Callable[[Callable[[str], None]], SftSamples],
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> TrainSummary:
    """Runs (or resumes) SFT in `workdir` from `params` (see the module docstring);
    `load_samples(log)` gives the rendered samples."""
    harness = RunHarness(workdir, settings.run, progress=progress, log=log)
    failed = True
    with harness.sigterm_stops():
        try:
            summary = _run(settings, harness, model, params, load_samples)
            failed = False
            return summary
        finally:
            harness.close(quiet=failed)


def _run(
    s: SftSettings,
    harness: RunHarness,
    model: ModelConfig,
    params: Any,
    load_samples: Callable[[Callable[[str], None]], SftSamples],
) -> TrainSummary:
    mesh = harness.open()
    log = harness.log
    data = load_samples(log)
    log(
        f"SFT: {len(data.samples)} samples from {list(data.files)}"
        + (f" ({data.too_long} longer than train.length_buckets left out)" if data.too_long else "")
    )
    frozen = s.optimizer.frozen_prefixes
    optimizer = make_optimizer(s.optimizer)
    init = functools.partial(init_train_state, optimizer=optimizer, seed=s.seed, frozen_prefixes=frozen)
    abstract = jax.eval_shape(init, params)
    shardings = state_shardings(abstract, param_logical_axes(model), mesh)

    def fresh() -> TrainState:
        return jax.jit(init, out_shardings=shardings)(jax.device_put(params, shardings.params))

    state, _ = harness.restore_or_init(abstract, shardings, fresh)
    step_fn = make_sft_step(model, s.step, optimizer, mesh, shardings)
    floor = BatchShape()  # the largest batch shape so far: vision sizes vary, compiles should not
    first, total = int(state.step), s.run.steps
    checkpoints = harness.checkpoints
    with harness.progress_bar(first, "sft") as bar:
        while int(state.step) < total and not harness.stopping():
            step = int(state.step)
            rows = [data.samples[i] for i in batch_indices(len(data.samples), s.batch_size, step, s.seed)]
            start = time.perf_counter()
            batch, stats = pack_batch(model, rows, np.zeros(len(rows), np.float32), s.batching, floor)
            floor = floor.cover(stats.shape)
            state, out = step_fn(state, shard_batch(batch, mesh))
            out = jax.device_get(out)
            elapsed = time.perf_counter() - start
            scalars = {
                tags.SFT_LOSS: float(out["loss"]),
                tags.SFT_LOSS_TOKENS: float(out["loss_tokens"]),
                tags.ACTOR_GRAD_NORM: float(out["grad_norm"]),
                tags.ACTOR_UPDATED: float(out["updated"]),
                tags.PERF_STEP_TIME: elapsed,
                tags.BATCH_LENGTH: stats.length,
                tags.PERF_TOKENS_PER_SEC: stats.real_tokens / max(elapsed, 1e-9),
            }
            harness.write_scalars(step + 1, scalars)
            log(_console_line(step + 1, total, scalars))
            bar.update(1)
            checkpoints.save(step + 1, state, {"step": step + 1})
    last = int(state.step)
    checkpoints.save(last, state, {"step": last}, force=True)
    checkpoints.wait()
    if last >= total:
        host_params = gather_to_host(state.params)  # every process takes part; process 0 gets the copy
        if harness.primary:
            out_dir = save_hf(model, host_params, s.export_dir, overwrite=True, dtype=s.export_dtype, progress=False)
            log(f"exported the SFT weights to {out_dir}")
    return harness.summary(first, last)
