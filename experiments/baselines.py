"""The untrained baseline every RL result must beat: the starting policy at fixed sampling
temperatures, the best chosen on a validation seed (`best_temperature`) and reported on the
held-out seed. Nothing is ever chosen on the held-out seed, and neither seed is trained on
(`check_validation_seed`). `experiments.baseline_runs` runs the evaluations.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from experiments.eval_summary import EvalSummary

BASELINES_DIR = "baselines"
VALIDATION = "validation"
HELDOUT = "heldout"


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """`per_kind` synthetic tasks of each kind of seed `seed`, `k` rollouts each; `name` is the
    directory its tasks and evaluations go under and the prefix of its TensorBoard tags."""

    name: str
    seed: int
    per_kind: int
    k: int

    def __post_init__(self) -> None:
        if self.per_kind < 1 or self.k < 1:
            raise ValueError(f"{self.name} set: per_kind and k must be >= 1, got {self.per_kind} and {self.k}")

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "per_kind": self.per_kind, "k": self.k}


def check_validation_seed(validation_seed: int, heldout_seed: int, training_seeds: Mapping[str, int]) -> None:
    """Raises ValueError unless the validation seed, the held-out seed and the training seeds
    (config key -> seed) all differ."""
    if validation_seed == heldout_seed:
        raise ValueError(
            f"the validation seed {validation_seed} must differ from the held-out seed {heldout_seed}: "
            "nothing may be chosen on the held-out tasks"
        )
    for name, seed in training_seeds.items():
        if seed == heldout_seed:
            raise ValueError(f"the training seed {name}={seed} must differ from the held-out seed {heldout_seed}")
        if seed == validation_seed:
            raise ValueError(f"the validation seed {validation_seed} must differ from the training seed {name}={seed}")


def best_temperature(accuracy_by_temperature: Sequence[tuple[float, float]]) -> float:
    """The temperature of the highest (temperature, accuracy) pair, the first listed among equals."""
    if not accuracy_by_temperature:
        raise ValueError("best temperature of no evaluations")
    best = max(range(len(accuracy_by_temperature)), key=lambda i: (accuracy_by_temperature[i][1], -i))
    return accuracy_by_temperature[best][0]


def temperature_entry(seed: int, temperature: float, summary: EvalSummary) -> dict[str, Any]:
    """One evaluation at a fixed temperature as results.json lists it (with per-task accuracies)."""
    return {"seed": seed, "temperature": temperature, **summary.as_dict(per_task=True)}


@dataclasses.dataclass(frozen=True)
class TemperatureBaselines:
    """The starting policy at each temperature on the validation and the held-out set; `best`
    is the held-out evaluation at the temperature chosen on validation."""

    validation_set: EvalSet
    heldout_set: EvalSet
    validation: Mapping[float, EvalSummary]
    heldout: Mapping[float, EvalSummary]

    def __post_init__(self) -> None:
        if list(self.validation) != list(self.heldout) or not self.validation:
            raise ValueError(
                f"baselines: validation temperatures {list(self.validation)} and held-out "
                f"{list(self.heldout)} must be the same non-empty list"
            )

    @property
    def best_temperature(self) -> float:
        return best_temperature([(t, e.accuracy) for t, e in self.validation.items()])

    @property
    def best(self) -> EvalSummary:
        return self.heldout[self.best_temperature]

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "temperatures": list(self.validation),
            "best_temperature": self.best_temperature,
            "best_heldout_accuracy": best.accuracy,
            "best_heldout_accuracy_ci95": best.interval().as_list(),
            "validation": [temperature_entry(self.validation_set.seed, t, e) for t, e in self.validation.items()],
            "heldout": [temperature_entry(self.heldout_set.seed, t, e) for t, e in self.heldout.items()],
        }
