import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyvision_jax.grading import (
    GroundTruthError,
    Score,
    extract_answer,
    get_scorer,
    mean_relative_accuracy,
    parse_number,
    register_scorer,
    score_math,
    score_multiple_choice,
    score_numeric,
    score_response,
)
from pyvision_jax.grading.scoring import SCORERS


def final(answer: str) -> str:
    return f"<think>look closer</think>\n<answer>\n\\boxed{{{answer}}}\n</answer>"


TOOL_TURN = (
    "<code>\n```python\nprint('<answer>\\\\boxed{Z}</answer>')\n```\n</code>"
    "<tool_response>\n<interpreter>\nText Result:\n<answer>\n\\boxed{Z}\n</answer>\n</interpreter>\n\n</tool_response>"
)


@pytest.mark.parametrize(
    "response, strict_expected, lenient_expected",
    [
        (final("B"), "B", "B"),
        (final("\\frac{\\sqrt{3}}{2}"), "\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}"),
        (final("\\{1, 2\\}"), "\\{1, 2\\}", "\\{1, 2\\}"),
        ("<answer>\\boxed{A}</answer> then <answer>\n\\boxed{C}\n</answer>", "C", "C"),
        (TOOL_TURN, None, None),
        (TOOL_TURN + "\n" + final("7"), "7", "7"),
        ("<answer>\nThe answer is \\boxed{4}.\n</answer>", None, "4"),
        ("<answer>\n\\boxed{4} or \\boxed{5}\n</answer>", None, "5"),
        ("<answer>\n\\boxed{4\n</answer>", None, "\\boxed{4"),
        ("<answer>\n\\boxed{}\n</answer>", None, None),
        ("<answer>\n\n</answer>", None, None),
        ("<answer>\n\\boxed{12}", None, "12"),
        ("I think it is \\boxed{9}", None, "9"),
        ("", None, None),
        ("no answer at all", None, None),
    ],
)
def test_extraction(response, strict_expected, lenient_expected):
    assert extract_answer(response, strict=True) == strict_expected
    assert extract_answer(response, strict=False) == lenient_expected


OPTIONS = ["A. a red apple", "B. a green pear", "C. a blue cup", "D. nothing"]


@pytest.mark.parametrize(
    "answer, ground_truth, correct",
    [
        ("C", "C", True),
        ("(C)", "C", True),
        ("C.", "(C)", True),
        ("C) a blue cup", "C", True),
        ("(c) a blue cup", "C", True),
        ("Option C", "C", True),
        ("a blue cup", "C", True),
        ("A blue cup.", "C", True),
        ("\\text{C}", "C", True),
        ("B", "C", False),
        ("a red apple", "C", False),
        ("C", "a blue cup", True),
        ("Cup", "C", False),
    ],
)
def test_multiple_choice(answer, ground_truth, correct):
    score = score_multiple_choice(final(answer), ground_truth, options=OPTIONS)
    assert score == Score(score=float(correct), correct=correct, extracted=answer)


def test_multiple_choice_unlabelled_options_and_missing_answer():
    assert score_multiple_choice(final("green"), "B", options=["red", "green"]).correct
    assert score_multiple_choice("no answer", "B") == Score(0.0, False, None)
    with pytest.raises(GroundTruthError, match="'maybe'"):
        score_multiple_choice(final("B"), "maybe")


@pytest.mark.parametrize(
    "text, value",
    [
        ("12", 12.0),
        ("12 cm", 12.0),
        ("-3.5 m^2", -3.5),
        ("1,234", 1234.0),
        ("\\frac{3}{4}", 0.75),
        ("-\\frac{1}{2}", -0.5),
        ("3/4", 0.75),
        ("2.5e3", 2500.0),
        ("$7$", 7.0),
        ("\\text{8 apples}", 8.0),
        ("two", 2.0),
        (".5", 0.5),
        ("about", None),
        ("", None),
        ("1/0", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "prediction, truth, mra",
    [
        (10, 10, 1.0),
        (10.4, 10, 1.0),
        (10.5, 10, 0.9),
        (12.5, 10, 0.5),
        (7.5, 10, 0.5),
        (14.9, 10, 0.1),
        (15, 10, 0.0),
        (0, 0, 1.0),
        (0.001, 0, 0.0),
        (-10, 10, 0.0),
        (float("inf"), 10, 0.0),
    ],
)
def test_mean_relative_accuracy(prediction, truth, mra):
    assert mean_relative_accuracy(prediction, truth) == pytest.approx(mra)


def test_numeric_scores_boxed_answer_only():
    response = "The image shows 3 rulers.\n<answer>\n\\boxed{12 cm}\n</answer>"
    assert score_numeric(response, "12") == Score(1.0, True, "12 cm")
    half = score_numeric(final("12.5"), 10)
    assert half.score == pytest.approx(0.5) and half.correct
    assert not score_numeric(final("13"), 10).correct
    assert score_numeric(final("zero"), "0").correct
    assert score_numeric(final("many"), "4") == Score(0.0, False, "many")
    assert score_numeric("5 items but no box", "5") == Score(0.0, False, None)
    with pytest.raises(GroundTruthError, match="'lots'"):
        score_numeric(final("5"), "lots")


@pytest.mark.parametrize(
    "answer, truth, correct",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{1}{2}", "1/2", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("x = 3", "3", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("0.333", "1/3", False),
        ("3", "4", False),
        ("Red", "red", True),
        ("\\text{the dog}", "The dog", True),
        ("cat", "dog", False),
    ],
)
def test_math_and_free_text(answer, truth, correct):
    assert score_math(final(answer), truth).correct is correct
    assert score_response(final(answer), truth, "math").correct is correct


def test_registry():
    assert score_response(final("(B)"), "B", "multiple_choice").correct
    assert score_response(final("9 m"), "9", "numeric").correct
    with pytest.raises(KeyError, match="unknown answer type 'counting'.*numeric"):
        get_scorer("counting")
    with pytest.raises(KeyError, match="'counting'"):
        score_response(final("3"), "3", "counting")
    with pytest.raises(TypeError):
        score_response(final("3"), "3", "numeric", options=["a"])
    register_scorer("exact", lambda response, truth: Score(float(response == truth), response == truth, response))
    try:
        assert score_response("x", "x", "exact").correct
    finally:
        del SCORERS["exact"]


def test_a_failing_scorer_scores_zero():
    def exploding(response, truth):
        raise RuntimeError("boom")

    register_scorer("exploding", exploding)
    try:
        assert score_response(final("3"), "3", "exploding") == Score(0.0, False, "3")
    finally:
        del SCORERS["exploding"]


TRICKY_PIECES = [
    "<answer>",
    "</answer>",
    "\\boxed{",
    "}",
    "{",
    "</interpreter>",
    "\n",
    "\\frac{",
    "(C)",
    "12 cm",
    "1/0",
    "9" * 400,
    "\\sqrt{",
    "$",
    "\\text{",
    "nan",
    "inf",
    "-",
    ".",
    "e999",
]


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.one_of(st.sampled_from(TRICKY_PIECES), st.text(max_size=8)), max_size=12),
    answer_type=st.sampled_from(["multiple_choice", "numeric", "math"]),
    strict=st.booleans(),
)
def test_no_response_crashes_a_scorer(pieces, answer_type, strict):
    response = "".join(pieces)
    truth = {"multiple_choice": "C", "numeric": "12", "math": "\\frac{1}{2}"}[answer_type]
    score = score_response(response, truth, answer_type, strict=strict)
    assert 0.0 <= score.score <= 1.0
    assert isinstance(score.correct, bool)
    assert score_response(None, truth, answer_type) == Score(0.0, False, None)
