"""Bootstrap confidence intervals over tasks.

The k rollouts of one task are not independent draws (they share the image, the question and
the policy's habits on it), so the unit of resampling is the task: each bootstrap replicate
draws N tasks with replacement and keeps every rollout of a drawn task together. The
statistic is the benchmark's accuracy, the mean over tasks of each task's fraction of correct
rollouts (`eval.metrics`). Intervals are percentile intervals of `resamples` replicates from a
seeded generator, so the same inputs always give the same interval.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int

    def as_list(self) -> list[float]:
        return [self.low, self.high]

    def summary(self, digits: int = 3) -> str:
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def task_accuracies(correct_by_task: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    """Each task's fraction of correct rollouts (tasks without rollouts left out)."""
    return {task: float(np.mean(np.asarray(c, np.float64))) for task, c in correct_by_task.items() if len(c)}


def record_task_accuracies(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per-task accuracies of trajectories.jsonl records (rollouts whose grading failed left
    out, as the metrics leave them out)."""
    correct: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        if not record.get("grading_failed", False):
            correct[record["task_id"]].append(bool(record["correct"]))
    return task_accuracies(correct)


def _check(values: np.ndarray, resamples: int, level: float) -> None:
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"bootstrap: expected a non-empty 1-D array of per-task values, got shape {values.shape}")
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap: level must be in (0, 1), got {level}")


def _replicate_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """[resamples] means of `values` [N] over N tasks drawn with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, values.size, size=(resamples, values.size))
    return values[draws].mean(axis=1)


def _interval(estimate: float, replicates: np.ndarray, level: float) -> Interval:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    return Interval(float(estimate), float(low), float(high), level, int(replicates.size))


def accuracy_interval(
    per_task_accuracy: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> Interval:
    """Accuracy (mean of the per-task accuracies [N]) and its bootstrap interval over tasks."""
    values = np.asarray(per_task_accuracy, np.float64)
    _check(values, resamples, level)
    return _interval(values.mean(), _replicate_means(values, resamples, seed), level)


def paired_difference_interval(
    baseline: Mapping[str, float],
    candidate: Mapping[str, float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> Interval:
    """Accuracy of `candidate` minus that of `baseline` on the same tasks (per-task accuracies
    keyed by task id) and its bootstrap interval: each replicate draws one set of tasks for
    both, so what the two share (the tasks' difficulty) cancels."""
    if set(baseline) != set(candidate):
        only = sorted(set(baseline) ^ set(candidate))
        raise ValueError(
            f"paired bootstrap: the two evaluations cover different tasks ({len(only)} differ, e.g. {only[0]!r})"
        )
    tasks = sorted(baseline)
    differences = np.asarray([candidate[t] - baseline[t] for t in tasks], np.float64)
    _check(differences, resamples, level)
    return _interval(differences.mean(), _replicate_means(differences, resamples, seed), level)
