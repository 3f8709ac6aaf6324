"""What the learning statistics need of one finished evaluation directory (`eval.evaluate`
output): the headline figures of results.json, and from trajectories.jsonl the per-task
accuracies (the unit of the bootstrap, `eval.bootstrap`) and the plan shares
(`pyvision_jax.eval.plan_shares`), over all rollouts and by the tasks' ability (a shapes task's
family), with the accuracy by ability, and the same by family (a shapes task's family: its ability
without the variant suffixes, `family_of`)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

from pyvision_jax.eval.bootstrap import Interval, accuracy_interval, record_task_accuracies
from pyvision_jax.eval.plan_shares import family_of, plan_shares, plan_shares_by, response_text, slim_records
from pyvision_jax.eval.records import RESULTS_FILE, TRAJECTORIES_FILE


@dataclasses.dataclass(frozen=True)
class EvalSummary:
    """One evaluation: accuracy (mean over tasks of each task's fraction of correct rollouts),
    mean tool calls per trajectory, per-task accuracies keyed by task id, plan shares over the
    rollouts and by task ability, and where it lies."""

    accuracy: float
    tool_calls: float
    per_task: Mapping[str, float]
    plans: Mapping[str, float]
    num_rollouts: int
    out_dir: str
    pass_at_k: float = 0.0
    end_reasons: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    plans_by_ability: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    accuracy_by_ability: Mapping[str, float] = dataclasses.field(default_factory=dict)
    plans_by_family: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    accuracy_by_family: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_records(
        cls, results: Mapping[str, Any], records: list[Mapping[str, Any]], out_dir: str | os.PathLike
    ) -> "EvalSummary":
        """From an evaluation's results.json dict and its trajectories.jsonl records."""
        per_task = record_task_accuracies(records)
        abilities = {r["task_id"]: r.get("ability", "") for r in records}
        return cls(
            accuracy=float(results["accuracy"]),
            tool_calls=float(results["tool_calls"]["mean"]),
            per_task=per_task,
            plans=plan_shares(response_text(r) for r in records),
            num_rollouts=int(results["num_rollouts"]),
            out_dir=str(out_dir),
            pass_at_k=float(results.get("pass_at_k", 0.0)),
            end_reasons=dict(results.get("end_reasons", {})),
            plans_by_ability=plan_shares_by((r.get("ability", ""), response_text(r)) for r in records),
            accuracy_by_ability=accuracy_by(per_task, abilities),
            plans_by_family=plan_shares_by((family_of(r.get("ability", "")), response_text(r)) for r in records),
            accuracy_by_family=accuracy_by(per_task, {task: family_of(a) for task, a in abilities.items()}),
        )

    @classmethod
    def from_dir(cls, out_dir: str | os.PathLike) -> "EvalSummary":
        out_dir = Path(out_dir)
        results = json.loads((out_dir / RESULTS_FILE).read_text())
        if not results.get("complete", False):
            raise ValueError(f"{out_dir}: the evaluation is not complete")
        return cls.from_records(results, list(slim_records(out_dir / TRAJECTORIES_FILE)), out_dir)

    def interval(self) -> Interval:
        """Accuracy with its 95 % bootstrap interval over tasks."""
        return accuracy_interval(list(self.per_task.values()))

    def summary(self) -> str:
        return (
            f"accuracy {self.interval().summary()}, tool calls {self.tool_calls:.2f}, "
            f"{self.num_rollouts} rollouts, end reasons {dict(self.end_reasons)}"
        )

    def as_dict(self, per_task: bool = False) -> dict[str, Any]:
        out = {
            "accuracy": self.accuracy,
            "accuracy_ci95": self.interval().as_list(),
            "pass_at_k": self.pass_at_k,
            "tool_calls": self.tool_calls,
            "plans": dict(self.plans),
            "plans_by_ability": {ability: dict(shares) for ability, shares in self.plans_by_ability.items()},
            "accuracy_by_ability": dict(self.accuracy_by_ability),
            "plans_by_family": {family: dict(shares) for family, shares in self.plans_by_family.items()},
            "accuracy_by_family": dict(self.accuracy_by_family),
            "end_reasons": dict(self.end_reasons),
            "num_rollouts": self.num_rollouts,
            "out_dir": self.out_dir,
        }
        if per_task:
            out["per_task"] = dict(self.per_task)
        return out


def accuracy_by(per_task: Mapping[str, float], labels: Mapping[str, str]) -> dict[str, float]:
    """{label: mean accuracy of its tasks} over per-task accuracies, each task labelled (e.g. by
    its ability, the family of a shapes task), labels in sorted order."""
    grouped: dict[str, list[float]] = {}
    for task, accuracy in per_task.items():
        grouped.setdefault(labels[task], []).append(accuracy)
    return {label: sum(grouped[label]) / len(grouped[label]) for label in sorted(grouped)}
