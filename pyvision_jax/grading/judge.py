"""The LLM judge: any OpenAI-compatible `/v1/chat/completions` server (e.g. `vllm serve`).

The released recipe judges every data source but the rule-verifiable ones with a served
Qwen2.5-72B-Instruct (model name "judge"), a few-shot prompt per task family, a system
message and sampling at temperature 0.3, and reads replies `Judgement: 1` / `Judgement: 0`
(or a bare 1 / 0). Here the prompt template is chosen by the task's data_source
(`JudgeConfig.family_prompts`, else `prompt`), and the temperature, the system message and
the verdict pattern are settings (ours: temperature 0, no system message, the reply's first
word after an optional "Judgement:" label). Requests of a batch run concurrently in a thread
pool, each with a timeout and a bounded number of retries. The judge only sees the
extracted final answer. A request that never gets a usable verdict (unreachable, timed out,
or a reply that is no verdict) is a judge failure: `verdicts` reports it as None and the
producer marks that rollout broken, never wrong.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import json
import re
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
VERDICT_LABEL = re.compile(r"^judge?ment\s*:\s*", re.IGNORECASE)
RELEASED_VERDICT_PATTERN = r"(?s)^(?:.*Judgement:)?\s*([01])"
"""The released reply format: the digit after the last "Judgement:", or a bare 1 / 0."""


class JudgeUnavailableError(ScorerUnavailableError):
    """The judge endpoint did not give a usable verdict within the allowed retries."""


def judge_template(path: str = "") -> PromptTemplate:
    """The judge prompt of `path` ("" : configs/prompts/judge.txt) with its named placeholders."""
    return load_template(path or DEFAULT_JUDGE_PROMPT_FILE, JUDGE_NAMES, JUDGE_NAMES)


def family_templates(pairs: Sequence[Sequence[str]]) -> tuple[tuple[str, PromptTemplate], ...]:
    """(data_source glob, template) per (glob, file) pair of grading.judge_prompt_files."""
    out = []
    for pair in pairs:
        if isinstance(pair, str) or len(pair) != 2:
            raise ValueError(f"grading.judge_prompt_files: {pair!r} must be a (data_source glob, file) pair")
        out.append((str(pair[0]), judge_template(str(pair[1]))))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    base_url: str
    """Server root, e.g. "http://127.0.0.1:8000" (the path /v1/chat/completions is appended)."""
    model: str = "judge"
    api_key: str | None = dataclasses.field(default=None, repr=False)
    """Sent as a bearer token (an OpenAI-compatible gateway's key); never shown by repr."""
    timeout_s: float = 30.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    max_concurrency: int = 8
    max_tokens: int = 8
    prompt: PromptTemplate = dataclasses.field(default_factory=judge_template)
    """The template of data sources that no `family_prompts` glob matches."""
    family_prompts: tuple[tuple[str, PromptTemplate], ...] = ()
    """(data_source glob, template), first match wins: the released few-shot prompt of each
    task family (`family_templates`)."""
    temperature: float = 0.0
    """Sampling temperature of the judge (released: 0.3)."""
    system_prompt: str = ""
    """A system message before the prompt ("": none; released: "You are a helpful assistant.")."""
    verdict_pattern: str = ""
    """A regex searched in the reply whose first group is the verdict word (yes/no, 1/0, ...);
    "": the first word after an optional "Judgement:" label. Released:
    `RELEASED_VERDICT_PATTERN`."""
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Extra request fields (e.g. vLLM's `structured_outputs`, or `logit_bias`)."""

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
        if self.temperature < 0:
            raise ValueError(
                f"JudgeConfig.temperature (grading.judge_temperature) must be >= 0, got {self.temperature}"
            )
        if self.verdict_pattern:
            try:
                groups = re.compile(self.verdict_pattern).groups
            except re.error as err:
                raise ValueError(
                    f"grading.judge_verdict_pattern {self.verdict_pattern!r} is not a regex: {err}"
                ) from None
            if groups < 1:
                raise ValueError(
                    f"grading.judge_verdict_pattern {self.verdict_pattern!r} needs a group (the verdict word)"
                )


def parse_verdict(reply: str, pattern: str = "") -> bool | None:
    """True/False when the reply says yes/no, else None. `pattern` "": the first word after
    an optional "Judgement:" label (case and markup ignored); else the first group of the
    pattern's first match in the stripped reply."""
    if pattern:
        match = re.search(pattern, reply.strip())
        word = (match.group(1) or "").strip().lower() if match else ""
    else:
        words = VERDICT_LABEL.sub("", reply.strip().lstrip("*#>\"' ")).lower().split()
        word = words[0].strip(".,:;!*\"'") if words else ""
    if word in YES_WORDS:
        return True
    return False if word in NO_WORDS else None


class LLMJudge:
    """Asks a chat model whether answers match their references."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.url = config.base_url.rstrip("/") + "/v1/chat/completions"

    def prompt(self, question: str, ground_truth: str, answer: str, data_source: str = "") -> str:
        """The judge prompt, from the template of the first `family_prompts` glob that matches
        `data_source` (else `prompt`)."""
        template = next(
            (t for pattern, t in self.config.family_prompts if fnmatch.fnmatchcase(data_source, pattern)),
            self.config.prompt,
        )
        return template.render({"question": question, "ground_truth": ground_truth, "answer": answer})

    def _request_once(self, prompt: str) -> str:
        system = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        body = json.dumps(
            {
                **self.config.extra_body,
                "model": self.config.model,
                "messages": system + [{"role": "user", "content": prompt}],
                "temperature": self.config.temperature,
                "max_tokens": self.config.max_tokens,
            }
        ).encode()
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
                reply = self._request_once(prompt)
                verdict = parse_verdict(reply, self.config.verdict_pattern)
                if verdict is not None:
                    return verdict
                last_error = f"a reply that is no verdict: {reply[:80]!r}"
            except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError) as error:
                last_error = repr(error)
            if attempt < self.config.max_retries:
                time.sleep(self.config.retry_backoff_s * (2**attempt))
        raise JudgeUnavailableError(
            f"judge at {self.url} failed {self.config.max_retries + 1} times; last error: {last_error}"
        )

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

    def __call__(
        self, response: str, ground_truth: str, *, question: str = "", strict: bool = True, gate: str = "last"
    ) -> Score:
        """Scorer-protocol entry point (`register_scorer`); raises JudgeUnavailableError."""
        extracted = extract_answer(response, strict=strict, gate=gate)
        if extracted is None:
            return ZERO_SCORE
        correct = self.ask(self.prompt(question, ground_truth, extracted))
        return Score(score=float(correct), correct=correct, extracted=extracted)
