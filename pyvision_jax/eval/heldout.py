"""Held-out evaluation around a training run: what it is (`HeldoutConfig`) and what one
evaluation found (`HeldoutResult`). The tasks come from a synthetic seed that neither RL
(`data.synthetic_seed`) nor SFT (`sft.synthetic_seed`) uses; `pyvision_jax.wiring.heldout`
runs the evaluations into WORKDIR/heldout/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyvision_jax.eval.bootstrap import accuracy_interval, record_task_accuracies
from pyvision_jax.eval.plan_shares import family_of, plan_shares_by, response_text, slim_records
from pyvision_jax.eval.records import TRAJECTORIES_FILE

HELDOUT_DIR = "heldout"


@dataclasses.dataclass(frozen=True)
class HeldoutConfig:
    """`per_kind` tasks of each synthetic kind (0: no held-out evaluation), generated with
    `seed`, `k` rollouts each (config keys eval.heldout_per_kind, eval.heldout_seed,
    eval.heldout_k). `training_seeds` names the seeds training draws from; the held-out seed
    must be none of them."""

    per_kind: int
    seed: int
    k: int
    training_seeds: tuple[tuple[str, int], ...] = ()
    distributed: bool = False

    def __post_init__(self) -> None:
        if self.per_kind < 0 or (self.per_kind and self.k < 1):
            raise ValueError(
                f"eval.heldout_per_kind must be >= 0 and eval.heldout_k >= 1, got {self.per_kind} and {self.k}"
            )
        if self.per_kind and self.distributed:
            raise ValueError(
                "eval.heldout_per_kind needs a single-process run (train.distributed is set); "
                "evaluate the checkpoint afterwards with launch/eval.py"
            )
        clash = [name for name, seed in self.training_seeds if seed == self.seed]
        if self.per_kind and clash:
            raise ValueError(
                f"eval.heldout_seed={self.seed} is also {clash[0]}: held-out tasks must come "
                "from a seed never trained on"
            )


@dataclasses.dataclass(frozen=True)
class HeldoutResult:
    """Headline figures of one held-out evaluation: accuracy, tool calls, each task's accuracy
    and, on the shapes toy, the plan shares of each task family (`eval.plan_shares`)."""

    accuracy: float
    tool_calls: float
    out_dir: Path
    per_task: Mapping[str, float] = dataclasses.field(default_factory=dict)
    plans_by_family: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_results(cls, results: dict[str, Any], out_dir: Path) -> "HeldoutResult":
        """From an evaluation's results.json dict and the trajectories.jsonl beside it."""
        records = list(slim_records(Path(out_dir) / TRAJECTORIES_FILE))
        families = [(family_of(r["ability"]), response_text(r)) for r in records]
        shapes = [(family, text) for family, text in families if family.startswith("shapes_")]
        return cls(
            float(results["accuracy"]),
            float(results["tool_calls"]["mean"]),
            out_dir,
            record_task_accuracies(records),
            plan_shares_by(shapes) if shapes else {},
        )

    def summary(self) -> str:
        return f"accuracy {self.accuracy:.3f}, tool calls {self.tool_calls:.2f}"

    def plans_summary(self) -> str:
        """Each family's plan shares on one line ("" without shapes tasks)."""
        return "; ".join(
            f"{family} " + ", ".join(f"{plan} {share:.2f}" for plan, share in shares.items())
            for family, shares in self.plans_by_family.items()
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "accuracy_ci95": accuracy_interval(list(self.per_task.values())).as_list() if self.per_task else None,
            "tool_calls": self.tool_calls,
            "plans_by_family": {family: dict(shares) for family, shares in self.plans_by_family.items()},
            "out_dir": str(self.out_dir),
        }
