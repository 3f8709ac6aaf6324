"""The per-trajectory scoring rule: answer types map to scorers, no answer or broken scores 0."""

import pytest

from pyvision_jax.grading.trajectory import final_turn_text, score_trajectory, task_scorer
from tests.grading.trajectories import CharTokenizer, boxed, task, trajectory


def test_final_turn_text_is_the_last_generated_span():
    assert final_turn_text(trajectory(boxed("B")), CharTokenizer()) == boxed("B")


@pytest.mark.parametrize(
    "answer_type,answer,response,options,score,correct",
    [
        ("multiple_choice", "B", "B", ("A. cat", "B. dog"), 1.0, True),
        ("multiple_choice", "B", "dog", ("A. cat", "B. dog"), 1.0, True),
        ("multiple_choice", "B", "A", ("A. cat", "B. dog"), 0.0, False),
        ("numeric", "10", "10", (), 1.0, True),
        ("numeric", "10", "1000", (), 0.0, False),
        ("text", "3", "3", (), 1.0, True),
        ("text", "3", "4", (), 0.0, False),
    ],
)
def test_answer_types_use_their_scorer(answer_type, answer, response, options, score, correct):
    result = score_trajectory(trajectory(boxed(response)), task(answer_type, answer, options), CharTokenizer())
    assert (result.score, result.correct) == (pytest.approx(score), correct)


def test_no_answer_and_broken_score_zero():
    t = task("text", "red")
    for traj in (trajectory(boxed("red"), answered=False), trajectory(boxed("red"), broken=True)):
        result = score_trajectory(traj, t, CharTokenizer())
        assert (result.score, result.correct, result.extracted) == (0.0, False, None)


def test_unknown_answer_type_raises_even_without_an_answer():
    odd = task("text", "red")
    object.__setattr__(odd, "answer_type", "chemistry")
    with pytest.raises(ValueError, match="chemistry"):
        task_scorer(odd)
    with pytest.raises(ValueError, match="chemistry"):
        score_trajectory(trajectory(boxed("red"), answered=False), odd, CharTokenizer())
