"""Scoring switches in both positions on the examples docs/recipe.md quotes: data_source routes (rule
scorers vs the LLM judge), the answer gate and the MRA thresholds; a judge failure is a
broken rollout, never a wrong one."""

import numpy as np
import pytest

from pyvision_jax.agent.templates import PromptTemplate
from pyvision_jax.grading.judge import JUDGE_NAMES, JudgeConfig, LLMJudge
from pyvision_jax.grading.routes import ANSWER_TYPE_ROUTES, RELEASED_ROUTES, Graded, ScorerRoutes, grade_trajectories
from pyvision_jax.grading.scoring import extract_answer, mean_relative_accuracy
from pyvision_jax.grading.trajectory import ScoringRules, score_task_response
from pyvision_jax.rl.rewards import accumulative_tool_reward
from tests.grading.trajectories import CharTokenizer, boxed, task, trajectory

RELEASED_RULES = ScoringRules(answer_gate="first_exact", mra_thresholds="float")


def judge_for(server, **overrides):
    settings = dict(base_url=server.url, timeout_s=2.0, max_retries=0, retry_backoff_s=0.0, max_concurrency=4)
    return LLMJudge(JudgeConfig(**(settings | overrides)))


def grade(routes, *cases):
    pairs = [(trajectory(response), task(kind, answer, data_source=source)) for response, kind, answer, source in cases]
    return grade_trajectories(pairs, CharTokenizer(), routes)


VSTAR_TAN = (boxed("The countertop is tan."), "text", "tan", "vstar")
DEEPEYES_4 = (boxed("4"), "numeric", "3", "deepeyes")


def test_our_routes_infer_the_scorer_from_the_ground_truth():
    tan, four = grade(ScorerRoutes(), VSTAR_TAN, DEEPEYES_4)
    assert tan == Graded(tan.score) and tan.score.score == 0.0
    assert four.score.score == pytest.approx(0.4) and not four.score.correct


def test_released_routes_send_everything_but_rule_sources_to_the_judge(server):
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge_for(server))
    tan, four = grade(routes, VSTAR_TAN, DEEPEYES_4)
    assert (tan.score.score, tan.score.correct, tan.broken) == (1.0, True, False)
    assert (four.score.score, four.score.correct, four.broken) == (0.0, False, False)
    assert len(server.requests) == 2
    prompts = [r["body"]["messages"][0]["content"] for r in server.requests]
    assert any(p.endswith("Reference answer: tan\nModel answer: The countertop is tan.\nJudgement:") for p in prompts)


def test_the_judge_prompt_follows_the_task_family_of_the_data_source(server):
    family = PromptTemplate(
        "VISUAL SEARCH\nReference answer: {ground_truth}\nModel answer: {answer}\n{question}",
        JUDGE_NAMES,
        JUDGE_NAMES,
        "vs.txt",
    )
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge_for(server, family_prompts=(("vstar", family),)))
    grade(routes, VSTAR_TAN, DEEPEYES_4)
    first_lines = sorted(r["body"]["messages"][0]["content"].split("\n")[0] for r in server.requests)
    assert first_lines[0] == "VISUAL SEARCH" and first_lines[1].startswith("You are judging")


def test_rule_verifiable_sources_stay_on_mra_under_the_released_table(server):
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge_for(server))
    vsi, rule, no_answer = grade(
        routes,
        (boxed("7"), "numeric", "10", "vsi_numerical"),
        (boxed("13"), "numeric", "10", "geo_rule_verifiable"),
        ("I give up.", "text", "tan", "vstar"),
    )
    assert vsi.score.score == rule.score.score == 0.5 and vsi.score.correct
    assert no_answer.score.score == 0.0 and not no_answer.broken
    assert server.requests == []


def test_a_judge_failure_marks_the_rollout_broken_not_wrong(server):
    server.failures = ["error"]
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge_for(server, max_concurrency=1))
    failed, fine = grade(routes, VSTAR_TAN, VSTAR_TAN)
    assert failed.broken and failed.score.score == 0.0
    assert not fine.broken and fine.score.correct


def test_route_table_errors_are_clear():
    with pytest.raises(ValueError, match="no judge is configured.*grading.judge_url"):
        ScorerRoutes(RELEASED_ROUTES)
    with pytest.raises(ValueError, match="grading.routes: \\('\\*', 'oracle'\\)"):
        ScorerRoutes((("*", "oracle"),))
    with pytest.raises(ValueError, match="no route in grading.routes matches data_source 'vstar'"):
        ScorerRoutes((("deepeyes", "numeric"),)).scorer_of(task("text", "tan", data_source="vstar"))
    assert ScorerRoutes().routes == ANSWER_TYPE_ROUTES


TWO_BLOCKS = "<answer>\n\\boxed{A}\n</answer> no, wait <answer>\n\\boxed{B}\n</answer>"
TWO_BOXES = "<answer>\n\\boxed{A} or \\boxed{B}\n</answer>"
RUN_TOGETHER = "<answer>\n\\boxed{A}</answer><answer>\n\\boxed{B}\n</answer>"
PRINTED = "<interpreter>\nText Result:\n<answer>\n\\boxed{Z}\n</answer>\n</interpreter>"


@pytest.mark.parametrize(
    "response, last, first_exact",
    [
        (TWO_BLOCKS, "B", "A"),
        (TWO_BOXES, None, None),  # released: the shortest match reads "A} or \boxed{B": void
        (RUN_TOGETHER, "B", None),  # released: "A}</answer><answer>\n\boxed{B": void
        ("<answer>\n\\boxed{A}\n</answer> and <answer>", "A", None),  # released: unbalanced tags read nothing
        ("<answer>\\boxed{A}</answer>", "A", None),
        ("<answer>\n\\boxed{ A }\n</answer>", "A", "A"),
        (PRINTED + "<answer>\n\\boxed{A}\n</answer>", "A", "Z"),  # released: the first block, a printed one too
        ("<answer>\n\\boxed{" + "x" * 1000 + "}\n</answer>", "x" * 1000, None),
        ("<answer>\n\\boxed{\\frac{1}{2}}\n</answer>", "\\frac{1}{2}", "\\frac{1}{2}"),
        ("no answer", None, None),
    ],
)
def test_answer_gate(response, last, first_exact):
    assert extract_answer(response) == last
    assert extract_answer(response, gate="first_exact") == first_exact


@pytest.mark.parametrize("answered", [True, False])
def test_the_released_gate_reads_the_whole_response_whatever_the_end_reason(answered, server):
    """An answer the model's code printed sits in a tool output: the released gate scores it,
    also when the rollout ran out of turns; ours reads the final turn of an answered rollout."""
    printed = trajectory(
        "<code>more</code>" if not answered else boxed("B"),
        answered=answered,
        observation="<tool_response>\n" + PRINTED.replace("Z", "A") + "\n</tool_response>",
    )
    mc = task("multiple_choice", "A", ("A. cat", "B. dog"))
    released = ScorerRoutes((("*", "multiple_choice"),), RELEASED_RULES)
    ours = ScorerRoutes((("*", "multiple_choice"),))
    ((released_grade,), (our_grade,)) = (
        grade_trajectories([(printed, mc)], CharTokenizer(), routes) for routes in (released, ours)
    )
    assert (released_grade.score.extracted, released_grade.score.correct) == ("A", True)
    assert our_grade.score.extracted == ("B" if answered else None) and not our_grade.score.correct
    judged = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge_for(server))
    (graded,) = grade_trajectories([(printed, task("text", "tan", data_source="vstar"))], CharTokenizer(), judged)
    assert graded.score.extracted == "A" and len(server.requests) == 1


def test_answer_gate_in_scoring():
    mc = task("multiple_choice", "A", ("A. cat", "B. dog"))
    assert score_task_response("<answer>\\boxed{A}</answer>", mc).correct
    assert not score_task_response("<answer>\\boxed{A}</answer>", mc, rules=RELEASED_RULES).correct
    assert score_task_response(TWO_BLOCKS, mc, rules=RELEASED_RULES).correct
    assert not score_task_response(TWO_BLOCKS, mc).correct


@pytest.mark.parametrize(
    "prediction, exact, released",
    [(7, 0.4, 0.5), (13, 0.4, 0.5), (10, 1.0, 1.0), (8, 0.6, 0.6), (5.5, 0.1, 0.1), (4, 0.0, 0.0)],
)
def test_mra_thresholds(prediction, exact, released):
    assert mean_relative_accuracy(prediction, 10) == pytest.approx(exact)
    assert mean_relative_accuracy(prediction, 10, "float") == pytest.approx(released)


def test_released_mra_pays_the_tool_bonus_at_a_relative_error_of_three_tenths():
    count = task("numeric", "10")
    ours = score_task_response(boxed("7"), count)
    released = score_task_response(boxed("7"), count, rules=RELEASED_RULES)
    assert (ours.score, ours.correct) == (pytest.approx(0.4), False)
    assert (released.score, released.correct) == (0.5, True)
    rewards = accumulative_tool_reward(
        np.array([[ours.score, released.score]]),
        np.array([[ours.correct, released.correct]]),
        np.array([[2, 2]]),
        np.ones((1, 2), bool),
    )
    np.testing.assert_allclose(np.asarray(rewards), [[0.4, 0.7]], rtol=1e-6)


def test_bad_rules_name_the_config_field():
    with pytest.raises(ValueError, match="grading.answer_gate"):
        ScoringRules(answer_gate="any")
    with pytest.raises(ValueError, match="grading.mra_thresholds"):
        ScoringRules(mra_thresholds="loose")
