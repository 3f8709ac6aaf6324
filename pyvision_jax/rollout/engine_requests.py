"""The JAX engine's host-side request state: a validated request with its PRNG key
(`PreparedRequest`), a decoding slot's tokens so far (`DecodingSlot`), when a token ends a
request, and the batch sizes the engine compiles for."""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.incremental_text import IncrementalText
from pyvision_jax.rollout.request_images import check_images


@dataclasses.dataclass
class PreparedRequest:
    """A validated request with its position in the call, token limit and PRNG key, and the
    held slot (``row``) whose first ``reused`` tokens and ``reused_images`` images it continues."""

    index: int
    request: GenerationRequest
    limit: int
    key: np.ndarray  # raw key data of the request's PRNG key
    pixel_values: np.ndarray | None = None  # patches of the images it prefills
    row: int | None = None
    reused: int = 0
    reused_images: int = 0


@dataclasses.dataclass
class DecodingSlot:
    """Host state of one decoding slot."""

    job: PreparedRequest
    position: int  # M-RoPE position of `last_token` (not yet in the cache)
    last_token: int
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    text: IncrementalText | None = None

    @property
    def context(self) -> int:
        """Tokens whose KV the slot's row holds: the prompt and all generated tokens but the last."""
        return len(self.job.request.prompt_token_ids) + len(self.token_ids) - 1


def prepare_requests(
    config: ModelConfig, requests: Sequence[GenerationRequest], params: SamplingParams, seed: int, largest: int
) -> list[PreparedRequest]:
    """Each request validated (a prompt, room in the `largest` cache length, its images) with
    its token limit and key: the call's seed folded with a CRC of the request id and the id's
    repeat count within the call."""
    repeats: Counter[str] = Counter()
    base = jax.random.key(seed)
    jobs = []
    for index, request in enumerate(requests):
        prompt = request.prompt_token_ids
        limit = request.token_limit(params)
        if not prompt:
            raise ValueError(f"request {request.request_id}: empty prompt_token_ids")
        if len(prompt) + limit > largest:
            raise ValueError(
                f"request {request.request_id}: prompt of {len(prompt)} tokens + token "
                f"limit {limit} exceeds the engine's largest length bucket {largest}"
            )
        check_images(config, request)
        key = jax.random.fold_in(base, zlib.crc32(request.request_id.encode()) & 0x7FFFFFFF)
        key = jax.random.fold_in(key, repeats[request.request_id])
        repeats[request.request_id] += 1
        jobs.append(PreparedRequest(index, request, limit, np.asarray(jax.random.key_data(key))))
    return jobs


def finish_reason(
    slot: DecodingSlot, token: int, eos_token_ids: frozenset[int], params: SamplingParams
) -> tuple[str | None, str | None]:
    """(finish reason, matched stop string) once `token` (already appended to the slot) ends
    its request: "eos" for a stop or end-of-turn id, "stop" for a stop string the token's
    text completes, "length" at the token limit; (None, None) otherwise."""
    reason, matched = None, None
    if token in eos_token_ids or token in params.stop_token_ids:
        reason = "eos"
    elif slot.text is not None:
        before = len(slot.text.text)
        if slot.text.append(token):
            text = slot.text.text
            hits = [(text.find(s, max(0, before - len(s) + 1)), s) for s in params.stop]
            hits = [(at + len(s), s) for at, s in hits if at >= 0]
            if hits:
                reason, matched = "stop", min(hits)[1]
    if reason is None and len(slot.token_ids) >= slot.job.limit:
        reason = "length"
    return reason, matched


def batch_sizes(
    max_batch: int, prefill_batch_sizes: Iterable[int] | None, decode_batch_sizes: Iterable[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefill, decode) batch sizes: positive, ending at `max_batch`; prefill defaults to
    1, 2, 4, ... max_batch and decode to the prefill sizes."""
    if prefill_batch_sizes is None:
        prefill_batch_sizes = [min(1 << k, max_batch) for k in range(max_batch.bit_length() + 1)]
    prefill = tuple(sorted({int(b) for b in prefill_batch_sizes}))
    if prefill[0] < 1 or prefill[-1] != max_batch:
        raise ValueError(
            f"JaxEngine: prefill_batch_sizes must be positive and end at max_batch={max_batch}, "
            f"got {prefill_batch_sizes}"
        )
    decode = tuple(sorted({int(b) for b in decode_batch_sizes or prefill}))
    if decode[0] < 1 or decode[-1] != max_batch:
        raise ValueError(
            f"JaxEngine: decode_batch_sizes must be positive and end at max_batch={max_batch}, got {decode_batch_sizes}"
        )
    return prefill, decode
