"""Benchmark metrics over the k scored rollouts of every task.

Definitions (T tasks, k rollouts each; ``score`` in [0, 1] is 0/1, or MRA for numeric
answers; ``correct`` is score == 1, or MRA >= 0.5):

- ``accuracy``: mean over tasks of the fraction of the k rollouts that are correct;
- ``avg@k``: mean over tasks of the mean score of the k rollouts (equals accuracy for 0/1
  answer types; with MRA it is the VSI-Bench-style mean score);
- ``pass@k``: fraction of tasks with at least one correct rollout among the k;
- ``accuracy_ci95``: the 95 % bootstrap interval of accuracy over tasks (`eval.bootstrap`).

Every task weighs the same whatever its k, so a task missing rollouts never skews the mean.
A rollout whose grading failed (the LLM judge gave no verdict) is left out of the score
metrics, as a missing rollout would be, and counted in ``num_grading_failures``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pyvision_jax.eval.bootstrap import accuracy_interval


@dataclass(frozen=True)
class RolloutOutcome:
    """What the metrics need of one scored trajectory."""

    task_id: str
    data_source: str
    rollout_index: int
    score: float
    correct: bool
    num_tool_calls: int
    end_reason: str
    visual_tokens: int
    response_tokens: int
    is_video: bool = False
    uniform_video_tokens: int | None = None
    grading_failed: bool = False

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RolloutOutcome":
        """From one line of trajectories.jsonl (see ``records.trajectory_record``)."""
        return cls(**{name: record[name] for name in cls.__dataclass_fields__ if name in record})


def avg_at_k(scores: Sequence[Sequence[float]]) -> float:
    """Mean over tasks of the mean over each task's rollouts."""
    if not scores:
        return 0.0
    return float(np.mean([np.mean(np.asarray(s, np.float64)) for s in scores]))


def pass_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """Fraction of tasks with at least one correct rollout."""
    if not correct:
        return 0.0
    return float(np.mean([bool(np.any(np.asarray(c, bool))) for c in correct]))


def _by_task(outcomes: Iterable[RolloutOutcome]) -> dict[str, list[RolloutOutcome]]:
    tasks: dict[str, list[RolloutOutcome]] = defaultdict(list)
    for outcome in outcomes:
        tasks[outcome.task_id].append(outcome)
    return dict(tasks)


def score_summary(tasks: Mapping[str, Sequence[RolloutOutcome]]) -> dict[str, float | int]:
    """accuracy, avg@k and pass@k over the given tasks (rollouts whose grading failed left out)."""
    failures = sum(o.grading_failed for g in tasks.values() for o in g)
    groups = [graded for g in tasks.values() if (graded := [o for o in g if not o.grading_failed])]
    return {
        "num_tasks": len(groups),
        "num_rollouts": sum(len(g) for g in groups),
        "num_grading_failures": failures,
        "accuracy": avg_at_k([[float(o.correct) for o in g] for g in groups]),
        "avg_at_k": avg_at_k([[o.score for o in g] for g in groups]),
        "pass_at_k": pass_at_k([[o.correct for o in g] for g in groups]),
    }


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def video_token_efficiency(tasks: Mapping[str, Sequence[RolloutOutcome]]) -> dict[str, Any]:
    """Per video task: mean visual tokens the agent put in its context over its rollouts vs
    the tokens of uniform 1-fps sampling of the same video; and the averages over tasks."""
    per_task = {}
    for task_id, group in tasks.items():
        if not group[0].is_video or group[0].uniform_video_tokens is None:
            continue
        agent = _mean([o.visual_tokens for o in group])
        uniform = int(group[0].uniform_video_tokens)
        per_task[task_id] = {
            "agent_visual_tokens": agent,
            "uniform_1fps_tokens": uniform,
            "ratio": agent / uniform if uniform else None,
        }
    agent_mean = _mean([t["agent_visual_tokens"] for t in per_task.values()])
    uniform_mean = _mean([t["uniform_1fps_tokens"] for t in per_task.values()])
    return {
        "num_video_tasks": len(per_task),
        "mean_agent_visual_tokens": agent_mean,
        "mean_uniform_1fps_tokens": uniform_mean,
        "ratio_of_means": agent_mean / uniform_mean if uniform_mean else None,
        "per_task": per_task,
    }


def summarize(outcomes: Iterable[RolloutOutcome]) -> dict[str, Any]:
    """The results.json metrics of a set of scored rollouts."""
    outcomes = list(outcomes)
    tasks = _by_task(outcomes)
    sources: dict[str, dict[str, list[RolloutOutcome]]] = defaultdict(dict)
    for task_id, group in tasks.items():
        sources[group[0].data_source][task_id] = group
    tool_calls = Counter(o.num_tool_calls for o in outcomes)
    graded = [[o.correct for o in g if not o.grading_failed] for g in tasks.values()]
    per_task = [float(np.mean(c)) for c in graded if c]
    return {
        **score_summary(tasks),
        "accuracy_ci95": accuracy_interval(per_task).as_list() if per_task else None,
        "per_data_source": {name: score_summary(sources[name]) for name in sorted(sources)},
        "tool_calls": {
            "mean": _mean([o.num_tool_calls for o in outcomes]),
            "distribution": {str(n): tool_calls[n] for n in sorted(tool_calls)},
        },
        "end_reasons": dict(sorted(Counter(o.end_reason for o in outcomes).items())),
        "mean_visual_tokens_per_task": _mean([_mean([o.visual_tokens for o in g]) for g in tasks.values()]),
        "mean_response_tokens": _mean([o.response_tokens for o in outcomes]),
        "video_token_efficiency": video_token_efficiency(tasks),
    }
