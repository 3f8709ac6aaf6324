"""The LLM judge against a stub OpenAI-compatible server on 127.0.0.1."""
import pytest

from pyvision_jax.grading import register_scorer, score_response
from pyvision_jax.grading.judge import JudgeConfig, JudgeUnavailableError, LLMJudge, parse_verdict
from pyvision_jax.grading.scoring import SCORERS


def final(answer):
    return f"<answer>\n\\boxed{{{answer}}}\n</answer>"


def make_judge(server, **overrides):
    settings = dict(base_url=server.url, model="judge", timeout_s=1.0, max_retries=2, retry_backoff_s=0.01,
                    max_concurrency=4)
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
    assert any("Question: What is it?\nReference answer: a cat\nModel answer: a dog\nJudgement:"
               in r["body"]["messages"][0]["content"] for r in server.requests)
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


@pytest.mark.parametrize("reply, verdict", [("YES", True), ("yes.", True), ("**Yes**", True), ("Correct", True),
                                            ("1", True), ("NO", False), ("No.", False), ("0", False),
                                            ("", None), ("Not sure, yes", None), ("maybe", None)])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_bad_settings():
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeConfig(base_url="http://127.0.0.1:1", model="m", max_concurrency=0)
