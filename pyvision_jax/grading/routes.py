"""Which scorer grades which task: a route table over `data_source`, and the batch grader.

A route is (glob over data_source, scorer); the first match wins. Scorers: "answer_type"
(ours: the rule scorer of the task's answer type, inferred from the ground truth when rows do
not say), a rule scorer by name ("numeric" is MRA, "multiple_choice", "math"), or "judge"
(the LLM judge). `RELEASED_ROUTES` is the released reward manager's table: MRA for
`vsi_numerical` and `*_rule_verifiable`, the judge for everything else.

`grade_trajectories` scores many trajectories at once: rule routes inline, judge routes as
one concurrent batch. A judge failure makes that rollout's `Graded.broken` true (score 0),
never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from typing import Any

from pyvision_jax.agent.prompts import format_question
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data.tasks import Task
from pyvision_jax.grading.judge import LLMJudge
from pyvision_jax.grading.scoring import ZERO_SCORE, Score, extract_answer
from pyvision_jax.grading.trajectory import BY_ANSWER_TYPE, ScoringRules, graded_text, score_trajectory

JUDGE = "judge"
RULE_SCORERS = (BY_ANSWER_TYPE, "numeric", "multiple_choice", "math")
ANSWER_TYPE_ROUTES = (("*", BY_ANSWER_TYPE),)
RELEASED_ROUTES = (("vsi_numerical", "numeric"), ("*_rule_verifiable", "numeric"), ("*", JUDGE))


@dataclasses.dataclass(frozen=True)
class Graded:
    """One rollout's score, and whether grading failed (the rollout then counts as broken)."""

    score: Score
    broken: bool = False


@dataclasses.dataclass(frozen=True)
class ScorerRoutes:
    """The route table, the scoring rules and the judge the "judge" routes use."""

    routes: tuple[tuple[str, str], ...] = ANSWER_TYPE_ROUTES
    rules: ScoringRules = ScoringRules()
    judge: LLMJudge | None = None

    def __post_init__(self) -> None:
        for route in self.routes:
            if isinstance(route, str) or len(route) != 2 or route[1] not in RULE_SCORERS + (JUDGE,):
                raise ValueError(
                    f"grading.routes: {route!r} must be a (data_source glob, scorer) pair with "
                    f"scorer one of {RULE_SCORERS + (JUDGE,)}"
                )
        if self.judge is None and any(scorer == JUDGE for _, scorer in self.routes):
            raise ValueError(
                "grading.routes sends data sources to the judge but no judge is configured "
                "(set grading.judge_url to an OpenAI-compatible server, e.g. `vllm serve`)"
            )

    def scorer_of(self, task: Task) -> str:
        """The scorer of the first route whose glob matches the task's data_source."""
        for pattern, scorer in self.routes:
            if fnmatch.fnmatchcase(task.data_source, pattern):
                return scorer
        raise ValueError(
            f"task {task.id}: no route in grading.routes matches data_source "
            f"{task.data_source!r} (routes: {self.routes})"
        )


def grade_trajectories(
    pairs: Sequence[tuple[Trajectory, Task]], tokenizer: Any, routes: ScorerRoutes = ScorerRoutes()
) -> list[Graded]:
    """One `Graded` per (trajectory, task), in order; the judge's requests run concurrently."""
    graded: list[Graded | None] = [None] * len(pairs)
    asked: list[tuple[int, str, str]] = []
    for index, (trajectory, task) in enumerate(pairs):
        scorer = routes.scorer_of(task)
        if scorer != JUDGE:
            graded[index] = Graded(score_trajectory(trajectory, task, tokenizer, scorer, routes.rules))
            continue
        text = graded_text(trajectory, tokenizer, routes.rules.answer_gate)
        answer = None if text is None else extract_answer(text, gate=routes.rules.answer_gate)
        if answer is None:
            graded[index] = Graded(ZERO_SCORE)
        else:
            asked.append(
                (
                    index,
                    answer,
                    routes.judge.prompt(format_question(task), task.answer, answer, data_source=task.data_source),
                )
            )
    if asked:
        verdicts = routes.judge.verdicts([prompt for _, _, prompt in asked])
        for (index, answer, _), verdict in zip(asked, verdicts):
            graded[index] = (
                Graded(ZERO_SCORE, broken=True) if verdict is None else Graded(Score(float(verdict), verdict, answer))
            )
    return graded
