"""The best constant answer on a set of multiple-choice tasks: the strongest answer a policy
that never looks at its input can give. It is chosen on the tasks it is scored on, so it is an
upper bound for every constant answer there, and a gain over it holds against all of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pyvision_jax.data.tasks import Task


@dataclasses.dataclass(frozen=True)
class ConstantAnswer:
    """Answering `answer` on every task: each task's accuracy (1 or 0) by task id."""

    answer: str
    per_task: Mapping[str, float]

    @property
    def accuracy(self) -> float:
        return sum(self.per_task.values()) / len(self.per_task)


def best_constant_answer(tasks: Sequence[Task]) -> ConstantAnswer | None:
    """The constant answer of highest accuracy on `tasks` (the alphabetically first among
    equals), or None unless every task is multiple-choice."""
    if not tasks or any(task.answer_type != "multiple_choice" for task in tasks):
        return None
    best = None
    for answer in sorted({task.answer for task in tasks}):
        candidate = ConstantAnswer(answer, {task.id: float(task.answer == answer) for task in tasks})
        if best is None or candidate.accuracy > best.accuracy:
            best = candidate
    return best
