"""The LLM judge against a stub OpenAI-compatible server on 127.0.0.1."""
import http.server
import json
import threading
import time

import pytest

from pyvision_jax.grading import Score, register_scorer, score_response
from pyvision_jax.grading.judge import JudgeConfig, JudgeUnavailableError, LLMJudge, parse_verdict
from pyvision_jax.grading.scoring import SCORERS


class StubChatServer(http.server.ThreadingHTTPServer):
    """Answers YES when the candidate equals the reference; scripted failures come first."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), StubChatHandler)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.failures: list[str] = []  # "error" (HTTP 500), "garbage" (bad JSON) or "slow"
        self.slow_seconds = 2.0
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StubChatHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server: StubChatServer = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append({"path": self.path, "body": body})
            failure = server.failures.pop(0) if server.failures else None
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            time.sleep(0.05)
            if failure == "slow":
                time.sleep(server.slow_seconds)
            if failure == "error":
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"overloaded")
                return
            prompt = body["messages"][0]["content"]
            reference = prompt.split("Reference answer: ")[1].split("\n")[0]
            candidate = prompt.split("Candidate answer: ")[1].split("\n")[0]
            verdict = "YES" if reference.lower() == candidate.lower() else "NO"
            payload = b"{not json" if failure == "garbage" else json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with server.lock:
                server.in_flight -= 1


@pytest.fixture
def server():
    stub = StubChatServer()
    thread = threading.Thread(target=stub.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield stub
    stub.shutdown()
    stub.server_close()
    thread.join(timeout=5)


def final(answer):
    return f"<answer>\n\\boxed{{{answer}}}\n</answer>"


def make_judge(server, **overrides):
    settings = dict(base_url=server.url, model="judge", timeout_s=1.0, max_retries=2, retry_backoff_s=0.01,
                    max_concurrency=4)
    settings.update(overrides)
    return LLMJudge(JudgeConfig(**settings))


def test_batch_is_scored_concurrently_at_temperature_zero(server):
    judge = make_judge(server)
    responses = [final("a cat"), final("a dog"), "no final answer", final("Blue")] * 2
    truths = ["a cat", "a cat", "a cat", "blue"] * 2
    scores = judge.score_batch(responses, truths, questions=["What is it?"] * 8)
    assert [s.correct for s in scores] == [True, False, False, True] * 2
    assert scores[2] == Score(0.0, False, None)
    assert len(server.requests) == 6  # the response without an answer is never sent
    assert all(r["path"] == "/v1/chat/completions" for r in server.requests)
    assert all(r["body"]["temperature"] == 0 and r["body"]["model"] == "judge" for r in server.requests)
    assert "What is it?" in server.requests[0]["body"]["messages"][0]["content"]
    assert server.max_in_flight > 1


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
                                            ("NO", False), ("", False), ("Not sure, yes", False)])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_bad_settings():
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeConfig(base_url="http://127.0.0.1:1", model="m", max_concurrency=0)
