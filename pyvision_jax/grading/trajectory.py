"""The per-trajectory scoring rule, shared by the producer (through `grading.routes`) and
evaluation.

A trajectory scores the text its answer gate reads (`graded_text`: ours, the final turn of a
rollout that ended with an answer; released, the whole response whatever the end reason)
with a rule scorer (the task's answer type's, or one a route names) under `ScoringRules`
(the answer gate and the MRA thresholds); a trajectory with nothing to read, or a broken
one, scores 0. The reward (score plus the
accumulative tool bonus) is ``rewards.accumulative_tool_reward`` over [P, G] arrays of these
scores.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data.tasks import Task
from pyvision_jax.grading.scoring import ANSWER_GATES, MRA_THRESHOLDS, SCORERS, ZERO_SCORE, Score, score_response

# A free-text answer goes to the math scorer: math_verify proves symbolic equivalence and falls
# back to literal comparison of the normalised strings.
SCORER_OF_ANSWER_TYPE = {"multiple_choice": "multiple_choice", "numeric": "numeric", "text": "math"}
BY_ANSWER_TYPE = "answer_type"


@dataclasses.dataclass(frozen=True)
class ScoringRules:
    """How answers are read and compared. answer_gate: "last" (ours: the last answer block,
    whitespace-tolerant) or "first_exact" (released); mra_thresholds: "exact" (ours) or
    "float" (released; 10 vs 7 scores 0.5, not 0.4)."""

    answer_gate: str = "last"
    mra_thresholds: str = "exact"

    def __post_init__(self) -> None:
        if self.answer_gate not in ANSWER_GATES:
            raise ValueError(f"grading.answer_gate must be one of {ANSWER_GATES}, got {self.answer_gate!r}")
        if self.mra_thresholds not in MRA_THRESHOLDS:
            raise ValueError(f"grading.mra_thresholds must be one of {MRA_THRESHOLDS}, got {self.mra_thresholds!r}")


def task_scorer(
    task: Task, scorer: str = BY_ANSWER_TYPE, rules: ScoringRules = ScoringRules()
) -> tuple[str, dict[str, Any]]:
    """The scorer key and its keyword arguments for ``task`` (``scorer`` "answer_type": the
    one of the task's answer type); the rules go to scorers that take them."""
    if scorer == BY_ANSWER_TYPE:
        scorer = SCORER_OF_ANSWER_TYPE.get(task.answer_type, task.answer_type)
    if scorer not in SCORERS:
        raise ValueError(
            f"task {task.id}: no scorer {scorer!r} (answer_type {task.answer_type!r}); known: {sorted(SCORERS)}"
        )
    kwargs: dict[str, Any] = {"options": tuple(task.options) or None} if scorer == "multiple_choice" else {}
    accepted = inspect.signature(SCORERS[scorer]).parameters
    rule_kwargs = {"gate": rules.answer_gate, "thresholds": rules.mra_thresholds}
    return scorer, kwargs | {k: v for k, v in rule_kwargs.items() if k in accepted}


def score_task_response(
    response: str, task: Task, scorer: str = BY_ANSWER_TYPE, rules: ScoringRules = ScoringRules()
) -> Score:
    """Scores a response text against ``task``'s ground truth (raises ``GroundTruthError``
    when the ground truth cannot be scored)."""
    key, kwargs = task_scorer(task, scorer, rules)
    return score_response(response, task.answer, key, **kwargs)


def final_turn_text(trajectory: Trajectory, tokenizer: Any) -> str:
    """The decoded tokens the model generated in its last turn ("" without turns)."""
    if not trajectory.turns:
        return ""
    last = trajectory.turns[-1]
    return tokenizer.decode(
        trajectory.token_ids[last.generated_start : last.generated_end].tolist(), skip_special_tokens=False
    )


def response_text(trajectory: Trajectory, tokenizer: Any) -> str:
    """Everything after the prompt, decoded: the generated turns and the tool outputs."""
    return tokenizer.decode(trajectory.token_ids[trajectory.prompt_length :].tolist(), skip_special_tokens=False)


def graded_text(trajectory: Trajectory, tokenizer: Any, gate: str) -> str | None:
    """The text the answer gate reads, None when there is nothing to score (a broken
    rollout, or no turn). Gate "last": the final turn of a rollout that ended with an answer.
    Gate "first_exact" (released): the whole response, tool outputs included, whatever the
    end reason."""
    if trajectory.broken or not trajectory.turns:
        return None
    if gate == "first_exact":
        return response_text(trajectory, tokenizer)
    return final_turn_text(trajectory, tokenizer) if trajectory.final_answer is not None else None


def score_trajectory(
    trajectory: Trajectory,
    task: Task,
    tokenizer: Any,
    scorer: str = BY_ANSWER_TYPE,
    rules: ScoringRules = ScoringRules(),
) -> Score:
    """The score of ``trajectory``'s answer on ``task`` with a rule scorer; 0 when the gate has
    nothing to read or the rollout broke. A scorer that does not exist is an error even
    without an answer."""
    task_scorer(task, scorer, rules)
    text = graded_text(trajectory, tokenizer, rules.answer_gate)
    if text is None:
        return ZERO_SCORE
    return score_task_response(text, task, scorer, rules)
