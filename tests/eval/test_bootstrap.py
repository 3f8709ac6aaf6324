"""Bootstrap intervals over tasks against loop-based numpy references."""

import numpy as np
import pytest

from pyvision_jax.eval.bootstrap import (
    accuracy_interval,
    paired_difference_interval,
    record_task_accuracies,
    task_accuracies,
)
from pyvision_jax.eval.metrics import RolloutOutcome, summarize


def reference_interval(values, resamples, level, seed):
    """One replicate at a time: draw len(values) task indices, average their values."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(values), size=(resamples, len(values)))
    means = sorted(float(np.mean([values[i] for i in row])) for row in draws)
    tail = (1 - level) / 2
    return np.quantile(means, tail), np.quantile(means, 1 - tail)


def test_accuracy_interval_matches_the_reference_and_brackets_the_estimate():
    values = [1.0, 0.5, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
    interval = accuracy_interval(values, resamples=500, level=0.9, seed=3)
    low, high = reference_interval(values, 500, 0.9, 3)
    assert interval.estimate == pytest.approx(np.mean(values))
    assert (interval.low, interval.high) == pytest.approx((low, high))
    assert interval.low < interval.estimate < interval.high
    assert accuracy_interval(values, resamples=500, level=0.9, seed=3) == interval  # seeded: repeatable


def test_tasks_are_resampled_whole_so_correlated_rollouts_widen_the_interval():
    # 20 tasks, 4 rollouts each, all rollouts of a task agree: 80 rollouts hold 20 tasks' evidence
    correct = {f"t{i}": [i % 2 == 0] * 4 for i in range(20)}
    per_task = list(task_accuracies(correct).values())
    over_tasks = accuracy_interval(per_task, resamples=4000)
    flat = [c for rollouts in correct.values() for c in rollouts]
    over_rollouts = accuracy_interval([float(c) for c in flat], resamples=4000)  # wrongly independent
    assert over_tasks.estimate == over_rollouts.estimate == 0.5
    assert over_tasks.high - over_tasks.low > 1.6 * (over_rollouts.high - over_rollouts.low)


def test_constant_accuracy_has_a_zero_width_interval():
    interval = accuracy_interval([0.75] * 6)
    assert (interval.low, interval.estimate, interval.high) == pytest.approx((0.75, 0.75, 0.75))


def test_paired_difference_cancels_what_the_tasks_share():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0, 1, 40)  # per-task accuracy varies a lot from task to task
    baseline = {f"t{i}": float(d) for i, d in enumerate(difficulty)}
    candidate = {t: min(1.0, a + 0.1) for t, a in baseline.items()}
    paired = paired_difference_interval(baseline, candidate, resamples=1000, seed=1)
    expected = np.mean([candidate[t] - baseline[t] for t in sorted(baseline)])
    low, high = reference_interval([candidate[t] - baseline[t] for t in sorted(baseline)], 1000, 0.95, 1)
    assert paired.estimate == pytest.approx(expected)
    assert (paired.low, paired.high) == pytest.approx((low, high))
    assert paired.low > 0.0  # a shift on every task is significant although the accuracies overlap
    unpaired = accuracy_interval(list(candidate.values()))
    assert unpaired.high - unpaired.low > 5 * (paired.high - paired.low)


def test_paired_difference_of_an_evaluation_with_itself_is_zero():
    same = {"a": 0.5, "b": 1.0, "c": 0.0}
    interval = paired_difference_interval(same, dict(same))
    assert (interval.low, interval.estimate, interval.high) == (0.0, 0.0, 0.0)


def test_paired_difference_refuses_different_tasks_and_bad_arguments():
    with pytest.raises(ValueError, match="different tasks"):
        paired_difference_interval({"a": 1.0}, {"b": 1.0})
    with pytest.raises(ValueError, match="non-empty"):
        accuracy_interval([])
    with pytest.raises(ValueError, match="level"):
        accuracy_interval([1.0], level=1.0)


def test_results_carry_the_interval_over_tasks():
    outcomes = [
        RolloutOutcome(task, "s", k, float(ok), ok, 1, "DONE", 4, 10)
        for task, oks in {"a": [True, True], "b": [False, False], "c": [True, False]}.items()
        for k, ok in enumerate(oks)
    ]
    results = summarize(outcomes)
    assert results["accuracy_ci95"] == pytest.approx(accuracy_interval([1.0, 0.0, 0.5]).as_list())
    assert results["accuracy_ci95"][0] < results["accuracy"] < results["accuracy_ci95"][1]


def test_record_task_accuracies_leave_out_failed_gradings():
    records = [
        {"task_id": "a", "correct": True},
        {"task_id": "a", "correct": False},
        {"task_id": "b", "correct": True, "grading_failed": True},
        {"task_id": "c", "correct": True},
    ]
    assert record_task_accuracies(records) == {"a": 0.5, "c": 1.0}
