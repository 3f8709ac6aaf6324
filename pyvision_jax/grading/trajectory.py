"""The one per-trajectory scoring rule, shared by the trainer, the rollout worker and evaluation.

A trajectory scores its final turn's generated text with the ``scoring`` scorer of the
task's answer type; a trajectory without an answer, or a broken one, scores 0. The reward
(score plus the accumulative tool bonus) is ``rewards.accumulative_tool_reward`` over
[P, G] arrays of these scores.
"""
from __future__ import annotations

from typing import Any

from pyvision_jax.data.tasks import Task
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.grading.scoring import SCORERS, ZERO_SCORE, Score, score_response

# A free-text answer goes to the math scorer: math_verify proves symbolic equivalence and falls
# back to literal comparison of the normalised strings.
SCORER_OF_ANSWER_TYPE = {"multiple_choice": "multiple_choice", "numeric": "numeric", "text": "math"}


def task_scorer(task: Task) -> tuple[str, dict[str, Any]]:
    """The scorer key and its keyword arguments for ``task``'s answer type."""
    scorer = SCORER_OF_ANSWER_TYPE.get(task.answer_type, task.answer_type)
    if scorer not in SCORERS:
        raise ValueError(f"task {task.id}: no scorer for answer_type {task.answer_type!r}; "
                         f"known: {sorted(SCORERS)}")
    kwargs = {"options": tuple(task.options) or None} if scorer == "multiple_choice" else {}
    return scorer, kwargs


def score_task_response(response: str, task: Task) -> Score:
    """Scores a response text against ``task``'s ground truth (raises ``GroundTruthError``
    when the ground truth cannot be scored)."""
    scorer, kwargs = task_scorer(task)
    return score_response(response, task.answer, scorer, **kwargs)


def final_turn_text(trajectory: Trajectory, tokenizer: Any) -> str:
    """The decoded tokens the model generated in its last turn ("" without turns)."""
    if not trajectory.turns:
        return ""
    last = trajectory.turns[-1]
    return tokenizer.decode(trajectory.token_ids[last.generated_start:last.generated_end].tolist(),
                            skip_special_tokens=False)


def score_trajectory(trajectory: Trajectory, task: Task, tokenizer: Any) -> Score:
    """The score of ``trajectory``'s final answer on ``task``; 0 without an answer or when
    broken. An answer type without a scorer is an error even when there is no answer."""
    task_scorer(task)
    if trajectory.final_answer is None or trajectory.broken or not trajectory.turns:
        return ZERO_SCORE
    return score_task_response(final_turn_text(trajectory, tokenizer), task)
