"""The embedded rollout engine: the Flax Qwen2.5-VL with a KV cache and continuous batching.

Shapes. The engine owns ``max_batch`` decode slots sharing one KV cache [max_batch, S]. All
jitted work runs on a few static shapes: prompts are left-padded to a length bucket and
prefilled in batches of 1, 2, 4, ... up to ``max_batch`` rows; decoding runs the first 1, 2,
4, ... slots that hold every active one for up to ``decode_chunk`` tokens per dispatch (one
compiled loop, ``pyvision_jax.rollout.decode_loop``, that stops early once every row has
ended); the cache length S is one of the length buckets plus ``decode_chunk``. New prompt
lengths, new requests and new weights within those shapes never recompile (``trace_counts``
counts the traces of every jitted function), and ``warm_up`` compiles them all before serving.

Cache layout: see ``pyvision_jax.rollout.slot_cache`` (every row's columns end before one
shared write column; rows are compacted together, and the cache grows only when that is not
enough). Positions never depend on columns: every token carries its M-RoPE position
(``rope_index`` for the prompt, then one more per generated token), so moving columns changes
no logits.

Continuous batching. ``generate`` queues its requests; whenever a slot is free the next
queued requests are prefilled into free slots, and after every decode dispatch the host
checks each new token in order: a stop token id or the end-of-turn token ends it with "eos",
a stop string completed by the token's text (incremental detokenization) ends it with "stop"
(the string is kept), the request's token limit ends it with "length". Tokens a slot produced
in its dispatch after it finished are discarded.

Context continuation (``kv_continuation``). A finished request's slot is held with its
context's KV (``pyvision_jax.rollout.held_context``). A later request with the same request id
whose prompt starts with that context (the episode's next turn: the context, the tool
response and its images, the next prompt) goes back to its slot, and only the rest of its
prompt is prefilled after the kept columns (``cache_rows.extend_rows``), with the positions
``rope_index`` gives those tokens in the whole prompt, so the logits are those of a prefill of
the whole prompt. Memory is bounded by the cache itself: a held slot is one of the
``max_batch`` rows, so holding costs nothing beyond the cache that serving ``max_batch``
requests needs, and S never exceeds the largest length bucket plus ``decode_chunk``; an
extension works on copies of its b target rows (S + block columns) for the call. A held slot
is given up (its episode's next request is prefilled in full) when a request needs a slot and
none is free (least recently held first), and all are given up on new weights. While slots
are held the cache only grows, it is never replaced by a smaller one.

Sampling. See ``pyvision_jax.rollout.sampling`` for exactly which distribution the logprobs
come from. Token k of a request is drawn with ``fold_in(key(seed, request), k)``, where the request key
folds the seed with a CRC of the request id (and the id's repeat count within the call), so a seeded
request gives the same tokens whatever slot, batch, timing, decode steps per dispatch or cache continuation it gets.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from functools import partial
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.agent.engine import GenerationRequest, GenerationResult, SamplingParams, end_of_turn_ids
from pyvision_jax.models import ModelConfig, stack_layers, unstack_layers
from pyvision_jax.models.rope_index import decode_position_ids
from pyvision_jax.rollout.cache_rows import counting, extend_tokens, prefill_rows
from pyvision_jax.rollout.decode_loop import decode_steps
from pyvision_jax.rollout.engine_placement import placements
from pyvision_jax.rollout.engine_requests import (
    DecodingSlot,
    PreparedRequest,
    batch_sizes,
    finish_reason,
    prepare_requests,
)
from pyvision_jax.rollout.engine_warm_up import WarmUp, warm_up
from pyvision_jax.rollout.held_context import HeldContext, reusable_prefix
from pyvision_jax.rollout.incremental_text import IncrementalText
from pyvision_jax.rollout.prompt_block import prompt_block, suffix_positions
from pyvision_jax.rollout.request_images import image_patches
from pyvision_jax.rollout.sampling import SamplingArrays
from pyvision_jax.rollout.slot_cache import SlotCache, smallest_bucket
from pyvision_jax.rollout.vision_floors import VisionFloors, image_floors
from pyvision_jax.rollout.weights.named_params import params_like

DEFAULT_LENGTH_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class JaxEngine:
    """In-process Qwen2.5-VL sampler implementing ``pyvision_jax.agent.engine.Engine``.

    ``params`` is the model's pure params dict (``init_params``, ``load_hf``, the trainer's
    state); ``tokenizer`` is used for the end-of-turn ids and to detect stop strings.
    ``length_buckets`` are the prompt lengths prefill pads to (and, plus ``decode_chunk``,
    the cache lengths); prompt + token limit must fit in the largest one. Prefill batches are
    padded to one of ``prefill_batch_sizes`` (default 1, 2, 4, ... max_batch). A decode
    dispatch runs up to ``decode_chunk`` steps (1: one step per dispatch) for the first ``r``
    slots, ``r`` the smallest of ``decode_batch_sizes`` (default: the prefill sizes) holding
    the active ones; when an active slot lies past ``r`` the active rows are first moved to
    the front (one jitted row gather), so that a call's stragglers do not pay for the whole
    batch. The cache never has fewer than ``min_cache_length`` columns (rounded up to a cache
    length), which avoids growing, and compiling for, larger caches when the workload's
    lengths are known. ``kv_continuation`` holds finished slots for their episode's next
    request (module docstring); off, every request is prefilled in full. The new tokens of a
    continued request (a tool response and the next prompt: usually short) are padded to one
    of ``extension_buckets`` (those below the smallest length bucket), or else of the length
    buckets. With ``live_span`` a decode dispatch attends only to the smallest cache length
    bucket of columns holding its rows' contexts (``decode_loop``), not to the whole cache.
    ``image_tokens_per_row`` > 0 fixes the vision layout sizes of blocks with images
    (``vision_floors.image_floors``) so that ``warm_up`` compiles them too.
    """

    def __init__(
        self,
        config: ModelConfig,
        params: Any,
        tokenizer: Any,
        *,
        max_batch: int = 8,
        length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
        decode_chunk: int = 8,
        prefill_batch_sizes: Sequence[int] | None = None,
        decode_batch_sizes: Sequence[int] | None = None,
        min_cache_length: int = 0,
        compute_dtype: Any = jnp.float32,
        cache_dtype: Any = None,
        version: int = 0,
        eos_token_ids: Iterable[int] | None = None,
        kv_continuation: bool = True,
        extension_buckets: Sequence[int] = (64, 256),
        live_span: bool = True,
        image_tokens_per_row: int = 0,
    ):
        if max_batch < 1:
            raise ValueError(f"JaxEngine: max_batch must be >= 1, got {max_batch}")
        if decode_chunk < 1:
            raise ValueError(f"JaxEngine: decode_chunk must be >= 1, got {decode_chunk}")
        buckets = tuple(sorted({int(b) for b in length_buckets}))
        if not buckets or buckets[0] < 1:
            raise ValueError(f"JaxEngine: length_buckets must be positive, got {length_buckets}")
        self.config = config
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.length_buckets = buckets
        self.extension_buckets = tuple(sorted({int(b) for b in extension_buckets if 0 < b < buckets[0]} | set(buckets)))
        self.decode_chunk = decode_chunk
        self.kv_continuation = bool(kv_continuation)
        self.live_span = bool(live_span)
        self.compute_dtype = jnp.dtype(compute_dtype).name
        self.cache_dtype = jnp.dtype(cache_dtype or compute_dtype)
        self.eos_token_ids = frozenset(
            end_of_turn_ids(tokenizer) if eos_token_ids is None else (int(t) for t in eos_token_ids)
        )
        self.prefill_batches, self.decode_batches = batch_sizes(max_batch, prefill_batch_sizes, decode_batch_sizes)
        self.trace_counts: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.token_counts: Counter[str] = Counter()  # "prefilled", "reused" prompt tokens; "generated"
        self.seconds: Counter[str] = Counter()  # host wall time of the "prefill", "extend", "decode" calls
        self._slots: list[DecodingSlot | HeldContext | None] = [None] * max_batch
        self._clock = 0
        self._params, placement = placements(unstack_layers(jax.tree.map(jnp.asarray, params)))
        counts = self.trace_counts, self.calls
        self._kv = SlotCache(
            config, self.decode_batches, buckets, decode_chunk, self.cache_dtype, min_cache_length, *counts, placement
        )
        self._version = int(version)
        self._lock = threading.Lock()
        self._seed_source = np.random.default_rng()
        floors = image_tokens_per_row and image_floors(config, self.prefill_batches, image_tokens_per_row)
        self._vision = VisionFloors(config, floors or None)
        # (params, cache, ...) -> (cache, ...): the cache is donated; traces are counted
        dtype, counts = self.compute_dtype, self.trace_counts
        self._prefill = jax.jit(counting(counts, "prefill", partial(prefill_rows, config, dtype)), donate_argnums=(1,))
        self._extend = jax.jit(counting(counts, "extend", partial(extend_tokens, config, dtype)), donate_argnums=(1,))
        self._decode = jax.jit(
            counting(counts, "decode", partial(decode_steps, config, dtype, decode_chunk)),
            donate_argnums=(1,),
            static_argnames=("span",),
        )

    # ------------------------------------------------------------------ Engine protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def params(self) -> Any:
        """The weights as the model's usual params (a stacked copy of the engine's own)."""
        return stack_layers(self._params)

    @property
    def held_slots(self) -> int:
        """Slots holding a finished request's context for its episode's next request."""
        return sum(isinstance(s, HeldContext) for s in self._slots)

    @property
    def compile_counts(self) -> dict[str, int]:
        """Compiled executables held by each jitted function (a retrace or a new argument
        placement adds one; ``trace_counts`` only sees retraces)."""
        functions = {"prefill": self._prefill, "extend": self._extend, "decode": self._decode}
        return {name: fn._cache_size() for name, fn in functions.items()} | self._kv.compile_counts

    @property
    def compiles(self) -> int:
        """All compiled executables of the engine's jitted functions (a timed round adds none
        after ``warm_up``)."""
        return sum(self.compile_counts.values())

    def warm_up(self) -> WarmUp:
        """Compiles every shape the engine can dispatch (``engine_warm_up``), blocks with images
        at the vision floors when it has some (``image_tokens_per_row``); the state is unchanged."""
        with self._lock:
            return warm_up(self, images=bool(self._vision.floors))

    def update_weights(self, weights: Any, version: int) -> None:
        """Swaps in new weights (same tree, shapes; cast to the current dtypes).

        ``weights`` is a params pytree like the one the engine was built with, or an
        iterable of (Hub or transformers-v5 tensor name, array in HF layout) pairs.
        """
        new_params = params_like(self.config, weights, self._params)
        with self._lock:
            self._params = new_params
            self._version = int(version)
            self._free([i for i, s in enumerate(self._slots) if isinstance(s, HeldContext)])  # old KV

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Continues every request (continuous batching over the slots); request order."""
        with self._lock:
            if not requests:
                return []
            seed = params.call_seed(self._seed_source)
            jobs = self._prepare(requests, params, seed)
            settings = SamplingArrays.create(params.temperature, params.top_k, params.top_p)
            stops = np.zeros(self.config.vocab_size, bool)
            stops[[t for t in self.eos_token_ids | set(params.stop_token_ids) if 0 <= t < len(stops)]] = True
            stop_mask = jnp.asarray(stops)
            version = self._version
            results: list[GenerationResult | None] = [None] * len(jobs)
            self._kv.reset(max(len(j.request.prompt_token_ids) for j in jobs))
            queued = deque(jobs)
            try:
                while queued or any(isinstance(s, DecodingSlot) for s in self._slots):
                    kind, joining, rows = self._joining(queued)
                    if joining:
                        admit = self._admit_extended if kind == "extend" else self._admit
                        admit(joining, rows, settings, params, results, version)
                        continue
                    self._decode_chunk(settings, stop_mask, params, results, version)
            except BaseException:  # the cache may have been donated to a call that failed
                self._free(range(self.max_batch))
                self._kv.cache = None
                raise
            return [r for r in results if r is not None]

    # ------------------------------------------------------------------ host side

    def _prepare(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, seed: int
    ) -> list[PreparedRequest]:
        """Validates the requests, gives each its key and held slot, and preprocesses the
        images each will prefill."""
        jobs = prepare_requests(self.config, requests, params, seed, self.length_buckets[-1])
        if self.kv_continuation:
            self._claim(jobs)
        for job in jobs:
            job.pixel_values = image_patches(self.config, job.request, job.reused_images)
        return jobs

    def _claim(self, jobs: list[PreparedRequest]) -> None:
        """Sends each request continuing a held slot's context back to that slot."""
        held = {i: s for i, s in enumerate(self._slots) if isinstance(s, HeldContext)}
        merge = self.config.vision.spatial_merge_size
        for job in jobs:
            options = [
                (reusable_prefix(s, job.request, self.config.image_token_id, merge), i)
                for i, s in held.items()
                if s.request_id == job.request.request_id
            ]
            if options:
                (reused, images), row = max(options)
                if reused > 0:
                    job.row, job.reused, job.reused_images = row, reused, images
                    del held[row]

    def _joining(self, queued: deque) -> tuple[str, list[PreparedRequest], list[int]]:
        """The next requests to admit and their slots: every queued continuation, else as many
        queued requests as there are free slots, given up held ones included (least
        recently held first)."""
        continuing = [j for j in queued if j.row is not None]
        if continuing:
            for job in continuing:
                queued.remove(job)
            return "extend", continuing, [j.row for j in continuing]
        free = [i for i, s in enumerate(self._slots) if s is None]
        held = sorted((s.used, i) for i, s in enumerate(self._slots) if isinstance(s, HeldContext))
        rows = (free + [i for _, i in held])[: len(queued)]
        self._free(rows)
        return "prefill", [queued.popleft() for _ in rows], rows

    def _free(self, rows: Iterable[int]) -> None:
        for i in rows:
            self._slots[i] = None
            self._kv.content[i] = 0

    def _block(
        self, joining: list[PreparedRequest], starts: Sequence[int], buckets: Sequence[int]
    ) -> tuple[dict, int, int]:
        """``prompt_block`` of the prompts' tokens from `starts` on, padded to one of `buckets`."""
        return prompt_block(
            self.config,
            [j.request.prompt_token_ids[s:] for j, s in zip(joining, starts)],
            [j.pixel_values for j in joining],
            [j.request.image_grid_thw[j.reused_images :] for j in joining],
            buckets,
            self.prefill_batches,
        )

    def _admit(
        self,
        joining: list[PreparedRequest],
        rows: list[int],
        settings: SamplingArrays,
        params: SamplingParams,
        results: list[GenerationResult | None],
        version: int,
    ) -> None:
        """Prefills `joining` into the free slots `rows` and takes their first tokens."""
        inputs, batch, length = self._block(joining, [0] * len(joining), self.length_buckets)
        model_inputs, deltas = self._vision.prepare(("prefill", batch), inputs)
        prompt_lengths = [len(j.request.prompt_token_ids) for j in joining]
        self._kv.hold_block(length)
        self._kv.make_room(max(prompt_lengths), 0)
        began = time.perf_counter()
        self._kv.cache, tokens, logprobs = self._prefill(
            self._params,
            self._kv.cache,
            model_inputs,
            self._targets(rows, batch),
            jnp.asarray(self._kv.index - length, jnp.int32),
            self._keys(joining, batch),
            settings,
        )
        tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)  # waits for the call
        self.seconds["prefill"] += time.perf_counter() - began
        self.calls["prefill"] += 1
        self.token_counts["prefilled"] += sum(prompt_lengths)
        starts = decode_position_ids(deltas, inputs["attention_mask"].sum(-1))[0, :, 0]
        self._seat(joining, rows, starts, tokens, logprobs, params, results, version)

    def _admit_extended(
        self,
        joining: list[PreparedRequest],
        rows: list[int],
        settings: SamplingArrays,
        params: SamplingParams,
        results: list[GenerationResult | None],
        version: int,
    ) -> None:
        """Prefills the rest of each continuing prompt after its held slot's kept columns and
        takes the first tokens."""
        inputs, batch, length = self._block(joining, [j.reused for j in joining], self.extension_buckets)
        inputs["position_ids"], starts = suffix_positions(
            self.config, [j.request for j in joining], [j.reused for j in joining], batch, length
        )
        model_inputs, _ = self._vision.prepare(("extend", batch), inputs)
        keep = np.zeros(batch, np.int32)
        keep[: len(joining)] = [j.reused for j in joining]
        self._kv.make_room(max(len(j.request.prompt_token_ids) for j in joining), 0)
        began = time.perf_counter()
        self._kv.cache, tokens, logprobs = self._extend(
            self._params,
            self._kv.cache,
            model_inputs,
            self._targets(rows, batch),
            jnp.asarray(keep),
            self._keys(joining, batch),
            settings,
        )
        tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)  # waits for the call
        self.seconds["extend"] += time.perf_counter() - began
        self.calls["extend"] += 1
        self.token_counts["reused"] += int(keep.sum())
        self.token_counts["prefilled"] += sum(len(j.request.prompt_token_ids) - j.reused for j in joining)
        self._seat(joining, rows, starts, tokens, logprobs, params, results, version)

    def _targets(self, rows: list[int], batch: int) -> jax.Array:
        targets = np.full(batch, self.max_batch, np.int32)  # out of range: dropped
        targets[: len(rows)] = rows
        return jnp.asarray(targets)

    def _keys(self, joining: list[PreparedRequest], batch: int) -> jax.Array:
        keys = np.zeros((batch, 2), np.uint32)
        keys[: len(joining)] = [j.key for j in joining]
        return jnp.asarray(keys)

    def _seat(
        self,
        joining: list[PreparedRequest],
        rows: list[int],
        starts: Sequence[int],
        tokens: np.ndarray,
        logprobs: np.ndarray,
        params: SamplingParams,
        results: list[GenerationResult | None],
        version: int,
    ) -> None:
        """Puts the prefilled requests in their slots with their first tokens."""
        for k, (job, row) in enumerate(zip(joining, rows)):
            self._slots[row] = DecodingSlot(
                job,
                position=int(starts[k]),
                last_token=int(tokens[k]),
                text=IncrementalText(self.tokenizer) if params.stop else None,
            )
            self._kv.content[row] = len(job.request.prompt_token_ids)
            self._accept(row, int(tokens[k]), float(logprobs[k]), params, results, version)

    def _decode_chunk(
        self,
        settings: SamplingArrays,
        stop_mask: jax.Array,
        params: SamplingParams,
        results: list[GenerationResult | None],
        version: int,
    ) -> None:
        """Runs up to `decode_chunk` tokens for the first slots (a decode batch size holding
        every active one, swapped to the front if needed) and hands each slot its tokens."""
        slots = self._slots
        self._kv.make_room(0, self.decode_chunk)
        active = [i for i, s in enumerate(slots) if isinstance(s, DecodingSlot)]
        rows = smallest_bucket(len(active), self.decode_batches)
        if active[-1] >= rows:  # the active rows beyond the batch trade places with others in it
            beyond = [i for i in active if i >= rows]
            within = [i for i in range(rows) if not isinstance(slots[i], DecodingSlot)][: len(beyond)]
            self._kv.swap_rows(within, beyond, alongside=slots)
        running = [s if isinstance(s, DecodingSlot) else None for s in slots[:rows]]
        live = np.array([s is not None for s in running])
        column = lambda value, dtype=np.int32: np.array([value(s) if s else 0 for s in running], dtype)
        began = time.perf_counter()
        self._kv.cache, new_tokens, new_logprobs, drawn, steps = self._decode(
            self._params,
            self._kv.cache,
            jnp.asarray(column(lambda s: s.last_token)),
            jnp.asarray(column(lambda s: s.position)),
            jnp.asarray(live),
            jnp.asarray(column(lambda s: len(s.token_ids))),
            jnp.asarray(column(lambda s: s.job.limit)),
            jnp.asarray(np.stack([s.job.key if s else np.zeros(2, np.uint32) for s in running])),
            stop_mask,
            settings,
            span=self._kv.span(max(s.context for s in running if s)) if self.live_span else 0,
        )
        new_tokens, new_logprobs, drawn = np.asarray(new_tokens), np.asarray(new_logprobs), np.asarray(drawn)
        steps = int(steps)
        self.seconds["decode"] += time.perf_counter() - began
        self._kv.index += steps
        self.calls["decode"] += 1
        self.calls["decode_steps"] += steps
        for i, slot in enumerate(running):
            if slot is None:
                continue
            slot.position += int(drawn[i])
            for step in range(int(drawn[i])):
                slot.last_token = int(new_tokens[i, step])
                if self._accept(i, slot.last_token, float(new_logprobs[i, step]), params, results, version):
                    break
            else:
                self._kv.content[i] = slot.context

    def _accept(
        self,
        i: int,
        token: int,
        logprob: float,
        params: SamplingParams,
        results: list[GenerationResult | None],
        version: int,
    ) -> bool:
        """Appends one token to slot i; on a finish, records the result and frees or holds
        the slot."""
        slot = self._slots[i]
        slot.token_ids.append(token)
        slot.logprobs.append(logprob)
        self.token_counts["generated"] += 1
        reason, matched = finish_reason(slot, token, self.eos_token_ids, params)
        if reason is None:
            return False
        results[slot.job.index] = GenerationResult(
            tuple(slot.token_ids), tuple(slot.logprobs), reason, matched, version
        )
        if self.kv_continuation:
            request = slot.job.request
            self._clock += 1
            self._slots[i] = HeldContext(
                request.request_id,
                np.asarray(request.prompt_token_ids + tuple(slot.token_ids[:-1])),
                request.images,
                request.image_grid_thw,
                self._clock,
            )
            self._kv.content[i] = slot.context
        else:
            self._free([i])
        return True
