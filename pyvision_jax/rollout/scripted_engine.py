"""An engine that replays written responses: for tests and for dry runs of the agent loop.

Each request's response for its k-th turn comes from a script (a mapping from request id, or
from the task id part of ``"{task_id}/{rollout}"``, to a list of turn texts, or a callable).
The text is tokenized with the real tokenizer and then treated exactly as a sampled
continuation would be: cut after the first stop string (kept), otherwise ended with the
end-of-turn token, then limited to the request's token budget. Logprobs are deterministic
pseudo-values so tests can check their alignment.

The engine also checks that every request's image-pad tokens match its image grids, which
catches visual-token accounting errors in the episode early.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pyvision_jax.agent.engine import GenerationRequest, GenerationResult, SamplingParams
from pyvision_jax.processing.tokens import num_visual_tokens

Script = Mapping[str, Sequence[str]] | Callable[[GenerationRequest, int], str]


class ScriptedEngine:
    """Replays ``script`` turn by turn; records every batch in ``calls``."""

    def __init__(
        self,
        tokenizer: Any,
        script: Script,
        *,
        version: int = 0,
        merge_size: int = 2,
        image_pad_token: str = "<|image_pad|>",
        on_generate: Callable[[Sequence[GenerationRequest]], None] | None = None,
    ):
        self._tokenizer = tokenizer
        self._script = script
        self._version = version
        self._merge_size = merge_size
        self._image_pad_id = tokenizer.convert_tokens_to_ids(image_pad_token)
        self._eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._on_generate = on_generate
        self._turns: dict[str, int] = defaultdict(int)
        self._turns_lock = threading.Lock()
        self.calls: list[tuple[str, ...]] = []

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, weights: Any, version: int) -> None:
        del weights
        self._version = version

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.calls.append(tuple(r.request_id for r in requests))
        if self._on_generate is not None:
            self._on_generate(requests)
        results = []
        for request in requests:
            results.append(self._respond(request, self._next_turn(request), params))
        return results

    def _next_turn(self, request: GenerationRequest) -> int:
        self._check_visual_tokens(request)
        with self._turns_lock:
            turn = self._turns[request.request_id]
            self._turns[request.request_id] += 1
        return turn

    def _response_text(self, request: GenerationRequest, turn: int) -> str:
        if callable(self._script):
            return self._script(request, turn)
        key = request.request_id
        if key not in self._script:
            key = request.request_id.rsplit("/", 1)[0]
        if key not in self._script:
            raise KeyError(f"ScriptedEngine: no script for request {request.request_id!r}")
        turns = self._script[key]
        if turn >= len(turns):
            raise IndexError(f"ScriptedEngine: script for {key!r} has {len(turns)} turns, turn {turn} requested")
        return turns[turn]

    def _respond(self, request: GenerationRequest, turn: int, params: SamplingParams) -> GenerationResult:
        text = self._response_text(request, turn)
        stop_hits = [(text.find(s) + len(s), s) for s in params.stop if s in text]
        if stop_hits:
            end, stop_string = min(stop_hits)
            token_ids = list(self._tokenizer.encode(text[:end], add_special_tokens=False))
            finish, matched = "stop", stop_string
        else:
            token_ids = list(self._tokenizer.encode(text, add_special_tokens=False))
            token_ids.append(self._eos_id)
            finish, matched = "eos", None
        limit = request.token_limit(params)
        if len(token_ids) > limit:
            token_ids, finish, matched = token_ids[:limit], "length", None
        logprobs = tuple(-0.001 * (1 + (7 * i + 13 * turn + tok) % 997) for i, tok in enumerate(token_ids))
        return GenerationResult(tuple(token_ids), logprobs, finish, matched, self._version)

    def _check_visual_tokens(self, request: GenerationRequest) -> None:
        expected = num_visual_tokens(request.image_grid_thw, self._merge_size)
        found = sum(1 for tok in request.prompt_token_ids if tok == self._image_pad_id)
        if expected != found:
            raise ValueError(
                f"request {request.request_id}: {found} image-pad tokens in the prompt but "
                f"the image grids account for {expected}"
            )


class StreamingScriptedEngine(ScriptedEngine):
    """A ScriptedEngine that also takes requests one at a time (the ``StreamingEngine``
    protocol): each result arrives `latency_s(request)` seconds after its submission,
    independently of every other request, like a continuous-batching server's."""

    def __init__(
        self,
        tokenizer: Any,
        script: Script,
        *,
        latency_s: Callable[[GenerationRequest], float] = lambda request: 0.0,
        **kwargs: Any,
    ):
        super().__init__(tokenizer, script, **kwargs)
        self._latency_s = latency_s
        self.submitted: list[str] = []

    def submit(self, request: GenerationRequest, params: SamplingParams) -> Future[GenerationResult]:
        future: Future = Future()
        self.submitted.append(request.request_id)
        try:
            result = self._respond(request, self._next_turn(request), params)
        except Exception as error:  # noqa: BLE001 - delivered through the future, like an engine's
            future.set_exception(error)
            return future
        timer = threading.Timer(self._latency_s(request), future.set_result, (result,))
        timer.daemon = True
        timer.start()
        return future


def script_from_file(path: str | os.PathLike) -> Callable[[GenerationRequest, int], str]:
    """A script from a JSON file `{request id, task id or "*": [turn texts]}`: a request id
    (`"{task_id}/{rollout}"`) scripts one rollout, a task id its rollouts, "*" any task."""
    script = json.loads(Path(path).read_text())
    if not isinstance(script, dict) or not all(
        isinstance(turns, list) and all(isinstance(t, str) for t in turns) for turns in script.values()
    ):
        raise ValueError(f"{path}: expected a JSON object of task id -> list of turn texts")

    def respond(request: GenerationRequest, turn: int) -> str:
        task_id = request.request_id.rsplit("/", 1)[0]
        turns = script.get(request.request_id, script.get(task_id, script.get("*")))
        if turns is None:
            raise KeyError(f"{path}: no script for task {task_id!r} and no '*' entry")
        return turns[min(turn, len(turns) - 1)]

    return respond
