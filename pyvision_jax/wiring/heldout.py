"""Held-out evaluation around a training run: accuracy before and after, on synthetic tasks
of a seed that neither RL (`data.synthetic_seed`) nor SFT (`sft.synthetic_seed`) uses.

The tasks go to WORKDIR/heldout/tasks, the evaluations to WORKDIR/heldout/before (the
config's own model) and WORKDIR/heldout/step_N (the run's latest checkpoint). Both are
ordinary `pyvision-eval` outputs (results.json, trajectories.jsonl, report.html), and a
rerun reuses what is already there. WORKDIR/heldout/summary.json holds both with their
intervals, the plan shares of each shapes family, and where every task is multiple-choice, the
after-training gain over the best constant answer on the same tasks (paired bootstrap).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections

from pyvision_jax.data import synthetic
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.eval.bootstrap import paired_difference_interval
from pyvision_jax.eval.constant_answer import best_constant_answer
from pyvision_jax.eval.heldout import HELDOUT_DIR, HeldoutResult
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.evaluation import evaluate_checkpoint
from pyvision_jax.wiring.settings import heldout_config

SUMMARY_FILE = "summary.json"  # before and after, plan shares by family, the best constant answer


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
    if before.plans_by_family:
        log(f"  plans by family: {before.plans_summary()}")
    summary = train(config, workdir, progress=progress)
    if summary.interrupted:  # stopped (SIGTERM): save and exit in time; the next run evaluates
        log(f"training stopped at step {summary.last_step}: the held-out evaluation after training is skipped")
        return summary, [before]
    after = evaluate_heldout(config, workdir, str(workdir), f"step_{summary.last_step}", progress)
    log(
        f"held-out after step {summary.last_step}: {after.summary()} ({after.out_dir}); "
        f"accuracy {before.accuracy:.3f} -> {after.accuracy:.3f}"
    )
    if after.plans_by_family:
        log(f"  plans by family: {after.plans_summary()}")
    report = {"before": before.as_dict(), f"after_step_{summary.last_step}": after.as_dict()}
    constant = best_constant_answer(load_tasks(heldout_tasks(config, workdir), check_media=False).tasks)
    if constant is not None:
        scored = {task: constant.per_task[task] for task in after.per_task}  # tasks whose grading failed left out
        gain = paired_difference_interval(scored, after.per_task)
        log(
            f"  gain over the best constant answer ({constant.answer!r}, accuracy {constant.accuracy:.3f} "
            f"on these tasks): {gain.estimate:+.3f} [{gain.low:+.3f}, {gain.high:+.3f}] (95 % bootstrap over "
            f"{len(constant.per_task)} tasks)"
        )
        report["best_constant_answer"] = {
            "answer": constant.answer,
            "accuracy": constant.accuracy,
            "after_minus_constant": {"estimate": gain.estimate, "ci95": gain.as_list()},
        }
    path = Path(workdir) / HELDOUT_DIR / SUMMARY_FILE
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return summary, [before, after]
