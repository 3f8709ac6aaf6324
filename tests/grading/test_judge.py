"""The LLM judge against a stub OpenAI-compatible server on 127.0.0.1."""

import pytest

from pyvision_jax.agent.templates import PromptTemplate
from pyvision_jax.grading import register_scorer, score_response
from pyvision_jax.grading.judge import (
    JUDGE_NAMES,
    RELEASED_VERDICT_PATTERN,
    JudgeConfig,
    JudgeUnavailableError,
    LLMJudge,
    family_templates,
    parse_verdict,
)
from pyvision_jax.grading.scoring import SCORERS


def final(answer):
    return f"<answer>\n\\boxed{{{answer}}}\n</answer>"


def make_judge(server, **overrides):
    settings = dict(
        base_url=server.url, model="judge", timeout_s=1.0, max_retries=2, retry_backoff_s=0.01, max_concurrency=4
    )
    settings.update(overrides)
    return LLMJudge(JudgeConfig(**settings))


def test_verdicts_are_asked_concurrently_at_temperature_zero(server):
    judge = make_judge(server)
    pairs = [("a cat", "a cat"), ("a cat", "a dog"), ("blue", "Blue")] * 2
    prompts = [judge.prompt("What is it?", truth, answer) for truth, answer in pairs]
    assert judge.verdicts(prompts) == [True, False, True] * 2
    assert judge.verdicts([]) == []
    assert len(server.requests) == 6
    assert all(r["path"] == "/v1/chat/completions" for r in server.requests)
    assert all(r["body"]["temperature"] == 0 and r["body"]["model"] == "judge" for r in server.requests)
    assert any(
        "Question: What is it?\nReference answer: a cat\nModel answer: a dog\nJudgement:"
        in r["body"]["messages"][0]["content"]
        for r in server.requests
    )
    assert server.max_in_flight > 1


def test_a_failed_request_is_a_missing_verdict_never_a_wrong_one(server):
    server.failures = ["error", "error"]
    judge = make_judge(server, max_retries=0, max_concurrency=1)
    assert judge.verdicts([judge.prompt("q", "x", "x")] * 3) == [None, None, True]


def test_an_unreadable_reply_is_retried_then_a_failure(server):
    judge = make_judge(server, max_retries=1, extra_body={"tag": 1})
    server.failures = ["garbage"]
    assert judge.verdicts([judge.prompt("q", "x", "x")]) == [True]
    assert server.requests[0]["body"]["tag"] == 1
    assert judge(final("x"), "x").correct and judge("no answer", "x").extracted is None


def test_retries_after_failing_responses(server):
    server.failures = ["error", "garbage"]
    judge = make_judge(server, max_concurrency=1)
    assert judge(final("7"), "7").correct
    assert len(server.requests) == 3


def test_retries_after_a_timeout(server):
    server.failures = ["slow"]
    server.slow_seconds = 5.0
    judge = make_judge(server, timeout_s=0.3, max_concurrency=1)
    assert judge(final("x"), "x").correct
    assert len(server.requests) == 2  # the slow request was abandoned, not awaited


def test_gives_up_with_a_clear_error(server):
    server.failures = ["error"] * 3
    judge = make_judge(server, max_retries=2)
    with pytest.raises(JudgeUnavailableError, match="failed 3 times"):
        judge(final("x"), "x")
    register_scorer("judge", make_judge(server, max_retries=0))
    try:
        server.failures = ["error"]
        with pytest.raises(JudgeUnavailableError):
            score_response(final("x"), "x", "judge")
        assert score_response(final("x"), "x", "judge", question="?").correct
    finally:
        del SCORERS["judge"]


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("YES", True),
        ("yes.", True),
        ("**Yes**", True),
        ("Correct", True),
        ("1", True),
        ("NO", False),
        ("No.", False),
        ("0", False),
        ("", None),
        ("Not sure, yes", None),
        ("maybe", None),
    ],
)
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


@pytest.mark.parametrize(
    "reply, ours, released",
    [
        ("Judgement: 1", True, True),
        ("Judgement: 0", False, False),
        ("1", True, True),
        ("0", False, False),
        ("judgment:  Yes", True, None),
        ("Yes", True, None),
        ("Reasoning first.\nJudgement: 1", None, True),
        ("Judgement: maybe", None, None),
        ("", None, None),
    ],
)
def test_verdict_patterns_read_the_released_reply_format(reply, ours, released):
    assert parse_verdict(reply) is ours
    assert parse_verdict(reply, RELEASED_VERDICT_PATTERN) is released


def family_judge(server, **overrides):
    """Few-shot templates per task family (data_source glob), like the released prompts."""
    lines = "Question: {question}\nReference answer: {ground_truth}\nModel answer: {answer}\nJudgement:"
    families = ((("vstar", "deepeyes"), "VISUAL SEARCH EXAMPLES"), (("vsi*",), "SPATIAL EXAMPLES"))
    prompts = tuple(
        (glob, PromptTemplate(f"{examples}\n{lines}", JUDGE_NAMES, JUDGE_NAMES, "t.txt"))
        for globs, examples in families
        for glob in globs
    )
    return make_judge(server, family_prompts=prompts, **overrides)


def test_the_released_judge_samples_at_its_temperature_with_a_system_message_and_family_prompts(server):
    server.reply_format = "judgement"
    released = family_judge(
        server, temperature=0.3, system_prompt="You are a helpful assistant.", verdict_pattern=RELEASED_VERDICT_PATTERN
    )
    prompts = [
        released.prompt("q", "tan", "tan", data_source="vstar"),
        released.prompt("q", "2", "3", data_source="vsi_count"),
        released.prompt("q", "A", "A", data_source="wemath"),
    ]
    assert [p.split("\n")[0] for p in prompts[:2]] == ["VISUAL SEARCH EXAMPLES", "SPATIAL EXAMPLES"]
    assert prompts[2] == make_judge(server).prompt("q", "A", "A")  # no family matches: grading.judge_prompt_file
    assert released.verdicts(prompts) == [True, False, True]
    bodies = [r["body"] for r in server.requests]
    assert all(b["temperature"] == 0.3 for b in bodies)
    assert all(b["messages"][0] == {"role": "system", "content": "You are a helpful assistant."} for b in bodies)
    # our position reads the released reply too, at temperature 0 and without a system message
    ours = make_judge(server)
    assert ours.verdicts([ours.prompt("q", "tan", "tan"), ours.prompt("q", "tan", "red")]) == [True, False]
    assert server.requests[-1]["body"]["temperature"] == 0 and len(server.requests[-1]["body"]["messages"]) == 1


def test_a_reply_the_released_pattern_cannot_read_is_a_failure(server):
    released = make_judge(server, max_retries=1, verdict_pattern=RELEASED_VERDICT_PATTERN)
    with pytest.raises(JudgeUnavailableError, match="no verdict: 'YES'"):
        released.ask(released.prompt("q", "x", "x"))  # the stub answers YES: not the released format


def test_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeConfig(base_url="http://127.0.0.1:1", model="m", max_concurrency=0)
    with pytest.raises(ValueError, match="judge_temperature"):
        JudgeConfig(base_url="http://127.0.0.1:1", temperature=-0.1)
    with pytest.raises(ValueError, match="needs a group"):
        JudgeConfig(base_url="http://127.0.0.1:1", verdict_pattern="Judgement: [01]")
    with pytest.raises(ValueError, match="not a regex"):
        JudgeConfig(base_url="http://127.0.0.1:1", verdict_pattern="([01]")
    path = tmp_path / "vsi.txt"
    path.write_text("{question} {ground_truth} {answer}\n")
    ((glob, template),) = family_templates((("vsi*", str(path)),))
    assert glob == "vsi*" and template.text == "{question} {ground_truth} {answer}"
    with pytest.raises(ValueError, match="grading.judge_prompt_files"):
        family_templates(("vsi*",))
