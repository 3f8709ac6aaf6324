"""The LLM judge: any OpenAI-compatible `/v1/chat/completions` server (e.g. `vllm serve`).

The released recipe judges every data source but the rule-verifiable ones with a served
Qwen2.5-72B-Instruct (model name "judge"). Requests of a batch run concurrently in a thread
pool, at temperature 0, each with a timeout and a bounded number of retries. The judge only
sees the extracted final answer. A request that never gets a usable verdict (unreachable,
timed out, or a reply that is neither yes nor no) is a judge failure: `verdicts` reports it
as None and the producer marks that rollout broken, never wrong.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Sequence

from pyvision_jax.agent.templates import PROMPTS_DIR, PromptTemplate, load_template
from pyvision_jax.grading.scoring import ZERO_SCORE, Score, ScorerUnavailableError, extract_answer

JUDGE_NAMES = ("question", "ground_truth", "answer")
DEFAULT_JUDGE_PROMPT_FILE = PROMPTS_DIR / "judge.txt"
YES_WORDS = frozenset({"yes", "correct", "true", "1"})
NO_WORDS = frozenset({"no", "incorrect", "wrong", "false", "0"})


class JudgeUnavailableError(ScorerUnavailableError):
    """The judge endpoint did not give a usable verdict within the allowed retries."""


def judge_template(path: str = "") -> PromptTemplate:
    """The judge prompt of `path` ("" : configs/prompts/judge.txt) with its named placeholders."""
    return load_template(path or DEFAULT_JUDGE_PROMPT_FILE, JUDGE_NAMES, JUDGE_NAMES)


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    base_url: str
    """Server root, e.g. "http://127.0.0.1:8000" (the path /v1/chat/completions is appended)."""
    model: str = "judge"
    api_key: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    max_concurrency: int = 8
    max_tokens: int = 8
    prompt: PromptTemplate = dataclasses.field(default_factory=judge_template)
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Extra request fields (e.g. vLLM's `guided_choice`, or `logit_bias`)."""

    def __post_init__(self):
        if not self.base_url:
            raise ValueError("JudgeConfig.base_url is empty (config: grading.judge_url)")
        if self.max_retries < 0:
            raise ValueError(f"JudgeConfig.max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"JudgeConfig.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"JudgeConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_tokens < 1:
            raise ValueError(f"JudgeConfig.max_tokens must be >= 1, got {self.max_tokens}")


def parse_verdict(reply: str) -> bool | None:
    """True/False when the reply's first word says yes/no (case and markup ignored), else None."""
    words = reply.strip().lstrip("*#>\"' ").lower().split()
    if not words:
        return None
    word = words[0].strip(".,:;!*\"'")
    if word in YES_WORDS:
        return True
    return False if word in NO_WORDS else None


class LLMJudge:
    """Asks a chat model whether answers match their references."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.url = config.base_url.rstrip("/") + "/v1/chat/completions"

    def prompt(self, question: str, ground_truth: str, answer: str) -> str:
        return self.config.prompt.render({"question": question, "ground_truth": ground_truth, "answer": answer})

    def _request_once(self, prompt: str) -> str:
        body = json.dumps({
            **self.config.extra_body,
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

    def ask(self, prompt: str) -> bool:
        """The judge's verdict on one prompt, retrying failed, timed-out or unreadable replies."""
        last_error: str = ""
        for attempt in range(self.config.max_retries + 1):
            try:
                verdict = parse_verdict(self._request_once(prompt))
                if verdict is not None:
                    return verdict
                last_error = "a reply that is neither yes nor no"
            except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError, IndexError,
                    TypeError) as error:
                last_error = repr(error)
            if attempt < self.config.max_retries:
                time.sleep(self.config.retry_backoff_s * (2**attempt))
        raise JudgeUnavailableError(
            f"judge at {self.url} failed {self.config.max_retries + 1} times; last error: {last_error}")

    def verdicts(self, prompts: Sequence[str]) -> list[bool | None]:
        """The verdict per prompt, asked concurrently; None where the judge failed."""
        out: list[bool | None] = [None] * len(prompts)
        if not prompts:
            return out
        with concurrent.futures.ThreadPoolExecutor(min(self.config.max_concurrency, len(prompts))) as pool:
            futures = {pool.submit(self.ask, prompt): index for index, prompt in enumerate(prompts)}
            for future in concurrent.futures.as_completed(futures):
                try:
                    out[futures[future]] = future.result()
                except JudgeUnavailableError:
                    out[futures[future]] = None
        return out

    def __call__(self, response: str, ground_truth: str, *, question: str = "", strict: bool = True,
                 gate: str = "last") -> Score:
        """Scorer-protocol entry point (`register_scorer`); raises JudgeUnavailableError."""
        extracted = extract_answer(response, strict=strict, gate=gate)
        if extracted is None:
            return ZERO_SCORE
        correct = self.ask(self.prompt(question, ground_truth, extracted))
        return Score(score=float(correct), correct=correct, extracted=extracted)
