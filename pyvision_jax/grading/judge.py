"""Optional LLM-judge scorer for an OpenAI-compatible `/v1/chat/completions` endpoint.

Requests for a batch run concurrently in a thread pool, at temperature 0, each with a
timeout and a bounded number of retries. The judge only sees the extracted final answer;
a response without one scores 0 and is never sent.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
import urllib.error
import urllib.request
from typing import Sequence

from pyvision_jax.grading.scoring import ZERO_SCORE, Score, ScorerUnavailableError, extract_answer

DEFAULT_JUDGE_PROMPT = (
    "You are grading an answer to a question.\n"
    "Question: {question}\n"
    "Reference answer: {ground_truth}\n"
    "Candidate answer: {answer}\n"
    "Does the candidate answer mean the same as the reference answer? "
    "Reply with exactly one word: YES or NO."
)


class JudgeUnavailableError(ScorerUnavailableError):
    """The judge endpoint did not give a usable reply within the allowed retries."""


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    base_url: str
    """Server root, e.g. "http://127.0.0.1:8000" (the path /v1/chat/completions is appended)."""
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    max_concurrency: int = 8
    max_tokens: int = 8
    prompt_template: str = DEFAULT_JUDGE_PROMPT

    def __post_init__(self):
        if self.max_retries < 0:
            raise ValueError(f"JudgeConfig.max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"JudgeConfig.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"JudgeConfig.timeout_s must be > 0, got {self.timeout_s}")


def parse_verdict(reply: str) -> bool:
    """True when the judge's reply starts with "yes" (case and punctuation ignored)."""
    words = reply.strip().lstrip("*#>\"' ").lower().split()
    return bool(words) and words[0].strip(".,:;!*\"'") in {"yes", "correct"}


class LLMJudge:
    """Scores answers by asking a chat model whether they match the reference."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.url = config.base_url.rstrip("/") + "/v1/chat/completions"

    def _request_once(self, prompt: str) -> str:
        body = json.dumps({
            "model": self.config.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": self.config.max_tokens,
        }).encode()
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.config.timeout_s) as reply:
            payload = json.loads(reply.read())
        return payload["choices"][0]["message"]["content"] or ""

    def ask(self, prompt: str) -> str:
        """The judge's reply to one prompt, retrying failed or timed-out requests."""
        last_error: Exception | None = None
        for attempt in range(self.config.max_retries + 1):
            try:
                return self._request_once(prompt)
            except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError, IndexError) as error:
                last_error = error
                if attempt < self.config.max_retries:
                    time.sleep(self.config.retry_backoff_s * (2**attempt))
        raise JudgeUnavailableError(
            f"judge at {self.url} failed {self.config.max_retries + 1} times; last error: {last_error!r}"
        )

    def score_batch(
        self,
        responses: Sequence[str],
        ground_truths: Sequence[str],
        questions: Sequence[str] | None = None,
        *,
        strict: bool = True,
    ) -> list[Score]:
        """Scores for a batch of responses, the requests sent concurrently."""
        if len(responses) != len(ground_truths):
            raise ValueError(
                f"score_batch got {len(responses)} responses but {len(ground_truths)} ground truths"
            )
        questions = list(questions) if questions is not None else [""] * len(responses)
        if len(questions) != len(responses):
            raise ValueError(f"score_batch got {len(questions)} questions for {len(responses)} responses")
        extracted = [extract_answer(r, strict=strict) if isinstance(r, str) else None for r in responses]
        scores: list[Score] = [ZERO_SCORE] * len(responses)
        pending = {
            index: self.config.prompt_template.format(
                question=questions[index], ground_truth=ground_truths[index], answer=answer
            )
            for index, answer in enumerate(extracted)
            if answer is not None
        }
        if not pending:
            return scores
        workers = min(self.config.max_concurrency, len(pending))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(self.ask, prompt): index for index, prompt in pending.items()}
            for future in concurrent.futures.as_completed(futures):
                index = futures[future]
                correct = parse_verdict(future.result())
                scores[index] = Score(score=float(correct), correct=correct, extracted=extracted[index])
        return scores

    def __call__(self, response: str, ground_truth: str, *, question: str = "", strict: bool = True) -> Score:
        """Scorer-protocol entry point, so a judge can be registered with `register_scorer`."""
        return self.score_batch([response], [ground_truth], [question], strict=strict)[0]
