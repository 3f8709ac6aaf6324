"""Held-out evaluation around a training run: accuracy before and after, on synthetic tasks
of a seed that neither RL (`data.synthetic_seed`) nor SFT (`sft.synthetic_seed`) uses.

The tasks go to WORKDIR/heldout/tasks, the evaluations to WORKDIR/heldout/before (the
config's own model) and WORKDIR/heldout/step_N (the run's latest checkpoint). Both are
ordinary `launch/eval.py` outputs (results.json, trajectories.jsonl, report.html), and a
rerun reuses what is already there.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections

from pyvision_jax import wiring
from pyvision_jax.data import synthetic
from pyvision_jax.eval.pipeline import evaluate_checkpoint

HELDOUT_DIR = "heldout"


@dataclasses.dataclass(frozen=True)
class HeldoutConfig:
    """`eval.heldout_per_kind` tasks of each synthetic kind (0: no held-out evaluation),
    generated with `eval.heldout_seed`, `eval.heldout_k` rollouts each."""

    per_kind: int
    seed: int
    k: int

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "HeldoutConfig":
        held = cls(int(config.eval.heldout_per_kind), int(config.eval.heldout_seed), int(config.eval.heldout_k))
        if held.per_kind < 0 or (held.per_kind and held.k < 1):
            raise ValueError(f"eval.heldout_per_kind must be >= 0 and eval.heldout_k >= 1, got "
                             f"{held.per_kind} and {held.k}")
        if held.per_kind and config.train.get("distributed", False):
            raise ValueError("eval.heldout_per_kind needs a single-process run (train.distributed is set); "
                             "evaluate the checkpoint afterwards with launch/eval.py")
        used = {"data.synthetic_seed": int(config.data.synthetic_seed),
                "sft.synthetic_seed": int(config.sft.synthetic_seed)}
        clash = [name for name, seed in used.items() if seed == held.seed]
        if held.per_kind and clash:
            raise ValueError(f"eval.heldout_seed={held.seed} is also {clash[0]}: held-out tasks must come "
                             "from a seed never trained on")
        return held


@dataclasses.dataclass(frozen=True)
class HeldoutResult:
    """Headline figures of one held-out evaluation."""

    accuracy: float
    tool_calls: float
    out_dir: Path

    @classmethod
    def from_results(cls, results: dict[str, Any], out_dir: Path) -> "HeldoutResult":
        return cls(float(results["accuracy"]), float(results["tool_calls"]["mean"]), out_dir)

    def summary(self) -> str:
        return f"accuracy {self.accuracy:.3f}, tool calls {self.tool_calls:.2f}"


def heldout_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Path:
    """WORKDIR/heldout/tasks/tasks.jsonl, written when absent."""
    held = HeldoutConfig.from_config(config)
    out_dir = Path(workdir) / HELDOUT_DIR / "tasks"
    path = out_dir / synthetic.ALL_TASKS_FILE
    if not path.is_file():
        kinds = wiring.str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
        synthetic.write_synthetic_task_file(out_dir, held.per_kind, held.seed, kinds)
    return path


def evaluate_heldout(config: ml_collections.ConfigDict, workdir: str | os.PathLike, checkpoint: str | None,
                     name: str, progress: bool = False) -> HeldoutResult:
    """Evaluates `checkpoint` (None: the config's own model) on the held-out tasks into
    WORKDIR/heldout/`name`."""
    held = HeldoutConfig.from_config(config)
    out_dir = Path(workdir) / HELDOUT_DIR / name
    results = evaluate_checkpoint(config, checkpoint, heldout_tasks(config, workdir), out_dir, k=held.k,
                                  progress=progress)
    return HeldoutResult.from_results(results, out_dir)


def train_with_heldout(config: ml_collections.ConfigDict, workdir: str | os.PathLike, train: Callable[..., Any],
                       progress: bool = True, log: Callable[[str], None] = print) -> tuple[Any, list[HeldoutResult]]:
    """`train(config, workdir, progress=...)` between two held-out evaluations (none when
    `eval.heldout_per_kind` is 0); returns the training summary and the evaluations."""
    if not HeldoutConfig.from_config(config).per_kind:
        return train(config, workdir, progress=progress), []
    before = evaluate_heldout(config, workdir, None, "before", progress)
    log(f"held-out before training: {before.summary()} ({before.out_dir})")
    summary = train(config, workdir, progress=progress)
    after = evaluate_heldout(config, workdir, str(workdir), f"step_{summary.last_step}", progress)
    log(f"held-out after step {summary.last_step}: {after.summary()} ({after.out_dir}); "
        f"accuracy {before.accuracy:.3f} -> {after.accuracy:.3f}")
    return summary, [before, after]
