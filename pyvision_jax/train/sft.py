"""The SFT loop: batches of rendered samples -> sharded SFT step -> metrics -> checkpoints,
and at the end the weights as an HF safetensors directory (what GRPO starts from).

The workdir layout is the GRPO trainer's (checkpoints/, tb/, config.json) plus sft_data/
(synthetic data) and hf/ (the export, unless `sft.export_dir` names another place).
Rerunning resumes from the latest checkpoint; batches depend only on the step, so the
resumed run trains on what the uninterrupted one would have. SIGTERM saves and stops.
"""
from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from pyvision_jax import wiring
from pyvision_jax.convert import save_hf
from pyvision_jax.models import param_logical_axes
from pyvision_jax.train import metric_names as tags
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.mesh import mesh_from_config
from pyvision_jax.train.metrics import MetricsWriter
from pyvision_jax.train.sft_data import batch_indices, load_sft_samples
from pyvision_jax.train.sft_step import make_sft_step
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, shard_batch
from pyvision_jax.train.trainer import CHECKPOINT_DIR, RESOLVED_CONFIG, TB_DIR, TrainSummary

EXPORT_DIR = "hf"


def export_dir(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Path:
    """Where the run's final weights go: `sft.export_dir`, else WORKDIR/hf."""
    return Path(config.sft.export_dir or Path(workdir) / EXPORT_DIR).absolute()


def _console_line(step: int, total: int, scalars: dict[str, float]) -> str:
    return (f"step {step}/{total} | loss {scalars[tags.SFT_LOSS]:.4f} | tokens {scalars[tags.SFT_LOSS_TOKENS]:.0f}"
            f" | gnorm {scalars[tags.ACTOR_GRAD_NORM]:.3g} | step_s {scalars[tags.PERF_STEP_TIME]:.2f}")


def train_sft(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *, progress: bool = True,
              log: Callable[[str], None] | None = None) -> TrainSummary:
    """Runs (or resumes) SFT in `workdir` (see the module docstring)."""
    log = log or (lambda line: tqdm.write(line))
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return _run(config, Path(workdir).absolute(), stop, progress, log)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(c: ml_collections.ConfigDict, workdir: Path, stop: threading.Event, progress: bool,
         log: Callable[[str], None]) -> TrainSummary:
    if c.sft.batch_size < 1:
        raise ValueError(f"sft.batch_size must be >= 1, got {c.sft.batch_size}")
    for sub in (CHECKPOINT_DIR, TB_DIR):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    (workdir / RESOLVED_CONFIG).write_text(c.to_json_best_effort(indent=2, sort_keys=True))
    tokenizer = wiring.load_tokenizer(c)
    model, params = wiring.load_model(c)
    data = load_sft_samples(c, workdir, model, tokenizer, log)
    log(f"SFT: {len(data.samples)} samples from {list(data.files)}"
        + (f" ({data.too_long} longer than train.length_buckets left out)" if data.too_long else ""))
    mesh = mesh_from_config(c.train)
    frozen = ("visual",) if c.train.freeze_vision else ()
    optimizer = make_optimizer(OptimizerConfig.from_config(c.train, frozen_prefixes=frozen))
    init = functools.partial(init_train_state, optimizer=optimizer, seed=c.seed, frozen_prefixes=frozen)
    abstract = jax.eval_shape(init, params)
    shardings = state_shardings(abstract, param_logical_axes(model), mesh)
    checkpoints = TrainCheckpoints(workdir / CHECKPOINT_DIR, c.train.checkpoint_every, c.train.keep_checkpoints)
    writer = MetricsWriter(workdir / TB_DIR)
    try:
        if checkpoints.latest_step() is not None:
            state, _ = checkpoints.restore(abstract, shardings)
            log(f"resumed from {checkpoints.directory} at step {int(state.step)}")
        else:
            state = jax.jit(init, out_shardings=shardings)(jax.device_put(params, shardings.params))
        del params
        step_config = StepConfig(logprob_chunk=c.train.logprob_chunk, compute_dtype=c.model.compute_dtype,
                                 frozen_prefixes=frozen)
        step_fn = make_sft_step(model, step_config, optimizer, mesh, shardings)
        batching = BatchingConfig(wiring.int_tuple(c.train.length_buckets, "train.length_buckets"),
                                  c.train.micro_batch)
        floor = BatchShape()  # the largest batch shape so far: vision sizes vary, compiles should not
        first, total = int(state.step), c.train.steps
        bar = tqdm(total=total, initial=min(first, total), desc="sft", unit="step", disable=not progress,
                   dynamic_ncols=True)
        with bar:
            while int(state.step) < total and not stop.is_set():
                step = int(state.step)
                rows = [data.samples[i] for i in batch_indices(len(data.samples), c.sft.batch_size, step, c.seed)]
                start = time.perf_counter()
                batch, stats = pack_batch(model, rows, np.zeros(len(rows), np.float32), batching, floor)
                floor = floor.cover(stats.shape)
                state, out = step_fn(state, shard_batch(batch, mesh))
                out = jax.device_get(out)
                elapsed = time.perf_counter() - start
                scalars = {tags.SFT_LOSS: float(out["loss"]), tags.SFT_LOSS_TOKENS: float(out["loss_tokens"]),
                           tags.ACTOR_GRAD_NORM: float(out["grad_norm"]), tags.ACTOR_UPDATED: float(out["updated"]),
                           tags.PERF_STEP_TIME: elapsed, tags.BATCH_LENGTH: stats.length,
                           tags.PERF_TOKENS_PER_SEC: stats.real_tokens / max(elapsed, 1e-9)}
                writer.write(step + 1, scalars)
                writer.flush()
                log(_console_line(step + 1, total, scalars))
                bar.update(1)
                checkpoints.save(step + 1, state, {"step": step + 1})
        last = int(state.step)
        checkpoints.save(last, state, {"step": last}, force=True)
        if last >= total:
            out_dir = save_hf(model, jax.device_get(state.params), export_dir(c, workdir), overwrite=True,
                              dtype=c.sft.export_dtype or None, progress=False)
            log(f"exported the SFT weights to {out_dir}")
        return TrainSummary(first, last, stop.is_set() and last < total, checkpoints.directory, writer.logdir,
                            str(workdir))
    finally:
        checkpoints.close()
        writer.close()
