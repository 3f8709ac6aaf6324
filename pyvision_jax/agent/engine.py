"""The Engine protocol: what an episode needs from a text generator.

An engine continues a batch of token sequences (each with the images already in its context)
and returns, per sequence, the new token ids, the behaviour-policy log-probability of each of
them and why generation stopped. Everything is token-in/token-out: the engine never sees
text it has to re-tokenize, and what it returns is appended to the trajectory verbatim.

Conventions every engine follows (the JAX sampler, vLLM and the scripted test engine):
- A matched stop string is KEPT in the output (vLLM's ``include_stop_str_in_output=True``):
  the tokens up to and including the token that completed the stop string are returned and
  ``stop_string`` names the string. ``finish_reason`` is then ``"stop"``.
- A stop token id (``stop_token_ids`` or the tokenizer's end-of-turn token) is also kept, with
  its logprob, and ``finish_reason`` is ``"eos"``.
- Reaching the request's token limit gives ``finish_reason == "length"``.
- ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the sampling distribution
  of the weights of version ``GenerationResult.policy_version``.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

FinishReason = Literal["stop", "length", "eos"]
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>")


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """The ids that end a turn unless a request says otherwise: Qwen's end-of-turn tokens
    and the tokenizer's eos (unknown tokens left out)."""
    ids = {tokenizer.convert_tokens_to_ids(t) for t in END_OF_TURN_TOKENS}
    ids.add(tokenizer.eos_token_id)
    return {int(i) for i in ids if i is not None and i != tokenizer.unk_token_id}


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by every request of one ``generate`` call.

    ``top_k <= 0`` and ``top_p >= 1`` disable those filters; ``seed`` None draws fresh
    randomness per call.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 10_240
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            raise TypeError("SamplingParams.stop must be a tuple of strings, not one string")

    def call_seed(self, fresh: np.random.Generator) -> int:
        """The seed of one `generate` call: `seed`, or a fresh draw from `fresh` when None."""
        return self.seed if self.seed is not None else int(fresh.integers(2**31))


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to continue.

    ``images`` are the images in the context in order of appearance, already resized to the
    size the visual tokens were counted for, so that any Qwen2.5-VL preprocessing with the
    same patch/merge sizes yields exactly ``image_grid_thw``; each image occupies
    ``t*h*w // merge**2`` consecutive image-pad tokens in ``prompt_token_ids``.
    ``max_new_tokens`` (when set) lowers the batch-wide limit for this request only, which is
    how a trajectory near its total-length budget asks for fewer tokens.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    images: tuple[Image.Image, ...] = ()
    image_grid_thw: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        grids = np.asarray(self.image_grid_thw, dtype=np.int64).reshape(-1, 3)
        object.__setattr__(self, "image_grid_thw", grids)
        if len(grids) != len(self.images):
            raise ValueError(
                f"request {self.request_id}: {len(self.images)} images but {len(grids)} rows in image_grid_thw"
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def token_limit(self, params: SamplingParams) -> int:
        """The number of new tokens this request may produce under ``params``."""
        if self.max_new_tokens is None:
            return params.max_new_tokens
        return min(self.max_new_tokens, params.max_new_tokens)


@dataclass(frozen=True)
class GenerationResult:
    """The continuation of one request (see the module docstring for the conventions)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    stop_string: str | None = None
    policy_version: int = 0

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"GenerationResult: {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")
        if self.finish_reason not in ("stop", "length", "eos"):
            raise ValueError(f"GenerationResult: unknown finish_reason {self.finish_reason!r}")


@runtime_checkable
class Engine(Protocol):
    """Anything that continues batches of token sequences under one set of weights."""

    @property
    def version(self) -> int:
        """The policy version (trainer step) of the weights currently loaded."""
        ...

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Continues every request; results are in request order."""
        ...

    def update_weights(self, weights: Any, version: int) -> None:
        """Loads new weights (a params pytree or an iterator of named arrays)."""
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that also takes requests one at a time, each continued as soon as there is
    room (continuous batching across everything submitted), with no barrier between them.

    The episode driver submits each trajectory's turn the moment it is ready instead of
    batching the ready ones into one ``generate`` call that waits for its slowest sequence.
    """

    def submit(self, request: GenerationRequest, params: SamplingParams) -> Future[GenerationResult]:
        """Queues one request; the future holds its result (or the engine's error)."""
        ...
