"""Held-out evaluation around a training run: accuracy before and after, on synthetic tasks
of a seed that neither RL (`data.synthetic_seed`) nor SFT (`sft.synthetic_seed`) uses.

The tasks go to WORKDIR/heldout/tasks, the evaluations to WORKDIR/heldout/before (the
config's own model) and WORKDIR/heldout/step_N (the run's latest checkpoint). Both are
ordinary `pyvision-eval` outputs (results.json, trajectories.jsonl, report.html), and a
rerun reuses what is already there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import ml_collections

from pyvision_jax.data import synthetic
from pyvision_jax.eval.heldout import HELDOUT_DIR, HeldoutResult
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.evaluation import evaluate_checkpoint
from pyvision_jax.wiring.settings import heldout_config


def heldout_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Path:
    """WORKDIR/heldout/tasks/tasks.jsonl, written when absent."""
    held = heldout_config(config)
    out_dir = Path(workdir) / HELDOUT_DIR / "tasks"
    path = out_dir / synthetic.ALL_TASKS_FILE
    if not path.is_file():
        kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
        synthetic.write_synthetic_task_file(out_dir, held.per_kind, held.seed, kinds)
    return path


def evaluate_heldout(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    checkpoint: str | None,
    name: str,
    progress: bool = False,
) -> HeldoutResult:
    """Evaluates `checkpoint` (None: the config's own model) on the held-out tasks into
    WORKDIR/heldout/`name`."""
    held = heldout_config(config)
    out_dir = Path(workdir) / HELDOUT_DIR / name
    results = evaluate_checkpoint(
        config, checkpoint, heldout_tasks(config, workdir), out_dir, k=held.k, progress=progress
    )
    return HeldoutResult.from_results(results, out_dir)


def train_with_heldout(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    train: Callable[..., Any],
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[Any, list[HeldoutResult]]:
    """`train(config, workdir, progress=...)` between two held-out evaluations (none when
    `eval.heldout_per_kind` is 0); returns the training summary and the evaluations."""
    if not heldout_config(config).per_kind:
        return train(config, workdir, progress=progress), []
    before = evaluate_heldout(config, workdir, None, "before", progress)
    log(f"held-out before training: {before.summary()} ({before.out_dir})")
    summary = train(config, workdir, progress=progress)
    if summary.interrupted:  # stopped (SIGTERM): save and exit in time; the next run evaluates
        log(f"training stopped at step {summary.last_step}: the held-out evaluation after training is skipped")
        return summary, [before]
    after = evaluate_heldout(config, workdir, str(workdir), f"step_{summary.last_step}", progress)
    log(
        f"held-out after step {summary.last_step}: {after.summary()} ({after.out_dir}); "
        f"accuracy {before.accuracy:.3f} -> {after.accuracy:.3f}"
    )
    return summary, [before, after]
