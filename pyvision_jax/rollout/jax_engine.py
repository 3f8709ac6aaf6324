"""The embedded rollout engine: the Flax Qwen2.5-VL with a KV cache and continuous batching.

Shapes. The engine owns ``max_batch`` decode slots sharing one KV cache [max_batch, S]. All
jitted work runs on a few static shapes: prompts are left-padded to a length bucket and
prefilled in batches of 1, 2, 4, ... up to ``max_batch`` rows; decoding runs the first 1, 2,
4, ... slots that hold every occupied one for ``decode_chunk`` tokens (one ``lax.scan``); the
cache length S is one of the length buckets plus ``decode_chunk``. New prompt lengths, new
requests and new weights within those shapes never recompile (``trace_counts`` counts the
traces of every jitted function).

Cache layout: see ``pyvision_jax.rollout.slot_cache`` (slots right-aligned at one shared
write column; rows shift left together, and the cache grows only when that is not enough).
Positions never depend on columns: every token carries its M-RoPE position (``rope_index``
for the prompt, then ``n_real_prompt + k + rope_delta``), so moving columns changes no logits.

Continuous batching. ``generate`` queues its requests; whenever a slot is free the next
queued requests are prefilled into free slots, and after every decode chunk the host checks
each new token in order: a stop token id or the end-of-turn token ends it with "eos", a stop
string completed by the token's text (incremental detokenization) ends it with "stop" (the
string is kept), the request's token limit ends it with "length". Tokens a slot produced in
its chunk after it finished are discarded and the slot is freed for the queue.

Sampling. See ``pyvision_jax.rollout.sampling`` for exactly which distribution the logprobs
come from. Token k of a request is drawn with ``fold_in(key(seed, request), k)``, where the
request key folds the seed with a CRC of the request id (and the id's repeat count within the
call), so a seeded request gives the same tokens whatever slot, batch or timing it gets.
"""

from __future__ import annotations

import dataclasses
import threading
import zlib
from collections import Counter, deque
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.convert.names import TensorKind, hub_name, is_tied_lm_head, tensor_kind
from pyvision_jax.convert.tree import stack_tensors
from pyvision_jax.models import KVCache, ModelConfig, ModelInputs, forward, prepare_inputs
from pyvision_jax.models.rope_index import decode_position_ids
from pyvision_jax.models.vision import window_units
from pyvision_jax.processing.image import preprocess_images
from pyvision_jax.agent.engine import GenerationRequest, GenerationResult, SamplingParams, end_of_turn_ids
from pyvision_jax.rollout.sampling import SamplingArrays, sample_tokens
from pyvision_jax.rollout.slot_cache import SlotCache, smallest_bucket

DEFAULT_LENGTH_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class IncrementalText:
    """Text of a growing token sequence, decoded incrementally (vLLM's detokenizer scheme).

    Only complete characters are appended: while the newest tokens decode to an incomplete
    UTF-8 sequence (a trailing U+FFFD), their text is held back until a later token
    completes it, so a stop string is found at the first token that completes it.
    """

    def __init__(self, tokenizer: Any, window: int = 6):
        self._tokenizer = tokenizer
        self._window = window
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def append(self, token_id: int) -> str:
        """Adds one token; returns the text it completed (possibly empty)."""
        self._ids.append(int(token_id))
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix):]
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._prefix_offset, self._read_offset - self._window)
        self.text += delta
        return delta


@dataclasses.dataclass
class _Prepared:
    """A validated request with its position in the call, token limit and PRNG key."""

    index: int
    request: GenerationRequest
    limit: int
    key: np.ndarray  # raw key data of the request's PRNG key
    pixel_values: np.ndarray | None


@dataclasses.dataclass
class _Slot:
    """Host state of one occupied decode slot."""

    job: _Prepared
    length: int  # valid cache columns of the row
    position: int  # M-RoPE position of `last_token` (not yet in the cache)
    last_token: int
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    text: IncrementalText | None = None


class JaxEngine:
    """In-process Qwen2.5-VL sampler implementing ``pyvision_jax.agent.engine.Engine``.

    ``params`` is the model's pure params dict (``init_params``, ``load_hf``, the trainer's
    state); ``tokenizer`` is used for the end-of-turn ids and to detect stop strings.
    ``length_buckets`` are the prompt lengths prefill pads to (and, plus ``decode_chunk``,
    the cache lengths); prompt + token limit must fit in the largest one. Prefill batches are
    padded to one of ``prefill_batch_sizes`` (default 1, 2, 4, ... max_batch). A decode chunk
    runs only the first ``r`` slots, ``r`` the smallest of ``decode_batch_sizes`` (default:
    the prefill sizes) holding the occupied ones; when an occupied slot lies past ``r`` the
    occupied rows are first moved to the front (one jitted row gather), so that a call's
    stragglers do not pay for the whole batch. The cache
    never has fewer than ``min_cache_length`` columns (rounded up to a cache length), which
    avoids growing, and compiling for, larger caches when the workload's lengths are known.
    """

    def __init__(self, config: ModelConfig, params: Any, tokenizer: Any, *, max_batch: int = 8,
                 length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS, decode_chunk: int = 8,
                 prefill_batch_sizes: Sequence[int] | None = None,
                 decode_batch_sizes: Sequence[int] | None = None, min_cache_length: int = 0,
                 compute_dtype: Any = jnp.float32, cache_dtype: Any = None, version: int = 0,
                 eos_token_ids: Iterable[int] | None = None):
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
        self.decode_chunk = decode_chunk
        self.compute_dtype = jnp.dtype(compute_dtype).name
        self.cache_dtype = jnp.dtype(cache_dtype or compute_dtype)
        self.eos_token_ids = frozenset(end_of_turn_ids(tokenizer) if eos_token_ids is None
                                       else (int(t) for t in eos_token_ids))
        if prefill_batch_sizes is None:
            prefill_batch_sizes = [min(1 << k, max_batch) for k in range(max_batch.bit_length() + 1)]
        self.prefill_batches = tuple(sorted({int(b) for b in prefill_batch_sizes}))
        if self.prefill_batches[0] < 1 or self.prefill_batches[-1] != max_batch:
            raise ValueError(f"JaxEngine: prefill_batch_sizes must be positive and end at "
                             f"max_batch={max_batch}, got {prefill_batch_sizes}")
        self.decode_batches = tuple(sorted({int(b) for b in decode_batch_sizes or self.prefill_batches}))
        if self.decode_batches[0] < 1 or self.decode_batches[-1] != max_batch:
            raise ValueError(f"JaxEngine: decode_batch_sizes must be positive and end at "
                             f"max_batch={max_batch}, got {decode_batch_sizes}")
        self.trace_counts: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._kv = SlotCache(config, max_batch, buckets, decode_chunk, self.cache_dtype,
                             min_cache_length, self.trace_counts, self.calls)
        self._params = jax.tree.map(jnp.asarray, params)
        self._version = int(version)
        self._lock = threading.Lock()
        self._seed_source = np.random.default_rng()
        self._vision_floor: dict[int, tuple[int, int]] = {}  # prefill batch -> (windows, merged)
        self._prefill = jax.jit(self._prefill_impl, donate_argnums=(1,))
        self._decode = jax.jit(self._decode_impl, donate_argnums=(1,))

    # ------------------------------------------------------------------ Engine protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def params(self) -> Any:
        return self._params

    @property
    def compile_counts(self) -> dict[str, int]:
        """Compiled executables held by each jitted function (a retrace or a new argument
        placement adds one; ``trace_counts`` only sees retraces)."""
        functions = {"prefill": self._prefill, "decode": self._decode}
        return {name: fn._cache_size() for name, fn in functions.items()} | self._kv.compile_counts

    def update_weights(self, weights: Any, version: int) -> None:
        """Swaps in new weights (same tree, shapes; cast to the current dtypes).

        ``weights`` is a params pytree like the one the engine was built with, or an
        iterable of (Hub or transformers-v5 tensor name, array in HF layout) pairs.
        """
        if not isinstance(weights, Mapping):
            weights = self._params_from_named(weights)
        current = self._params
        if jax.tree.structure(weights) != jax.tree.structure(current):
            raise ValueError("update_weights: the new weights' tree differs from the engine's "
                             f"params: {jax.tree.structure(weights)} vs {jax.tree.structure(current)}")

        def convert(path: Any, new: Any, old: jax.Array) -> jax.Array:
            if tuple(np.shape(new)) != old.shape:
                raise ValueError(f"update_weights: {jax.tree_util.keystr(path)} has shape "
                                 f"{tuple(np.shape(new))}, the engine's params {old.shape}")
            value = jnp.asarray(new, old.dtype)
            # a committed array where the old leaf was not (or vice versa) would recompile
            return jax.device_put(value, old.sharding) if old.committed else value

        new_params = jax.tree_util.tree_map_with_path(convert, weights, current)
        with self._lock:
            self._params = new_params
            self._version = int(version)

    def _params_from_named(self, named: Iterable[tuple[str, Any]]) -> dict:
        """A params tree from (HF name, HF-layout array) pairs; missing or unknown tensors raise."""
        hf_config = self.config.to_hf_dict()
        tensors: dict[str, np.ndarray] = {}
        for name, array in named:
            if is_tied_lm_head(name, hf_config):
                continue
            array = np.asarray(array.detach().cpu().float().numpy() if hasattr(array, "detach")
                               else array)
            kind = tensor_kind(hub_name(name))
            if kind is TensorKind.LINEAR_WEIGHT:
                array = array.T
            elif kind is TensorKind.CONV_WEIGHT:
                array = array.reshape(array.shape[0], -1).T
            tensors[name] = array
        try:
            return stack_tensors(tensors, hf_config)
        except ValueError as error:
            raise ValueError(f"update_weights: {error}") from None

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[GenerationResult]:
        """Continues every request (continuous batching over the slots); request order."""
        with self._lock:
            if not requests:
                return []
            seed = params.call_seed(self._seed_source)
            jobs = self._prepare(requests, params, seed)
            settings = SamplingArrays.create(params.temperature, params.top_k, params.top_p)
            version = self._version
            results: list[GenerationResult | None] = [None] * len(jobs)
            self._kv.reset(max(len(j.request.prompt_token_ids) for j in jobs))
            queued = deque(jobs)
            slots: list[_Slot | None] = [None] * self.max_batch
            while queued or any(slots):
                free = [i for i, s in enumerate(slots) if s is None]
                if queued and free:
                    joining = [queued.popleft() for _ in range(min(len(free), len(queued)))]
                    self._admit(joining, free, slots, settings, params, results, version)
                    continue
                self._decode_chunk(slots, settings, params, results, version)
            return [r for r in results if r is not None]

    # ------------------------------------------------------------------ host side

    def _prepare(self, requests: Sequence[GenerationRequest], params: SamplingParams,
                 seed: int) -> list[_Prepared]:
        largest = self.length_buckets[-1]
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
                    f"limit {limit} exceeds the engine's largest length bucket {largest}")
            pixel_values = self._pixel_values(request)
            key = jax.random.fold_in(base, zlib.crc32(request.request_id.encode()) & 0x7FFFFFFF)
            key = jax.random.fold_in(key, repeats[request.request_id])
            repeats[request.request_id] += 1
            jobs.append(_Prepared(index, request, limit, np.asarray(jax.random.key_data(key)),
                                  pixel_values))
        return jobs

    def _pixel_values(self, request: GenerationRequest) -> np.ndarray | None:
        """Patches of the request's images, checked against its grids and pad tokens."""
        vision = self.config.vision
        grids = request.image_grid_thw
        pads = sum(1 for t in request.prompt_token_ids if t == self.config.image_token_id)
        expected = int(np.sum(np.prod(grids, axis=-1))) // vision.spatial_merge_size ** 2
        if pads != expected:
            raise ValueError(f"request {request.request_id}: {pads} image-pad tokens in the "
                             f"prompt but image_grid_thw accounts for {expected}")
        if not request.images:
            return None
        for k, (image, (_, h, w)) in enumerate(zip(request.images, grids)):
            size = (int(w) * vision.patch_size, int(h) * vision.patch_size)
            if image.size != size:
                raise ValueError(f"request {request.request_id}: image {k} is {image.size[0]}x"
                                 f"{image.size[1]} but its grid {list(map(int, grids[k]))} "
                                 f"needs {size[0]}x{size[1]} (images come resized)")
        pixels = [im.size[0] * im.size[1] for im in request.images]
        patches, got = preprocess_images(
            request.images, min_pixels=min(pixels), max_pixels=max(pixels),
            patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
            temporal_patch_size=vision.temporal_patch_size)
        if not np.array_equal(got, grids):
            raise ValueError(f"request {request.request_id}: preprocessing gave grids "
                             f"{got.tolist()}, the request says {grids.tolist()}")
        return patches

    def _admit(self, joining: list[_Prepared], free: list[int], slots: list[_Slot | None],
               settings: SamplingArrays, params: SamplingParams,
               results: list[GenerationResult | None], version: int) -> None:
        """Prefills `joining` into free slots and takes their first tokens."""
        prompts = [j.request.prompt_token_ids for j in joining]
        length = smallest_bucket(max(map(len, prompts)), self.length_buckets)
        batch = smallest_bucket(len(joining), self.prefill_batches)
        ids = np.full((batch, length), self.config.pad_token_id, np.int32)
        mask = np.zeros((batch, length), bool)
        for row, prompt in enumerate(prompts):
            ids[row, length - len(prompt):] = prompt
            mask[row, length - len(prompt):] = True
        inputs = {"input_ids": ids, "attention_mask": mask}
        with_images = [j for j in joining if j.pixel_values is not None]
        if with_images:
            inputs["pixel_values"] = np.concatenate([j.pixel_values for j in with_images])
            inputs["image_grid_thw"] = np.concatenate([j.request.image_grid_thw
                                                       for j in with_images])
        model_inputs, deltas = self._prepare_held(batch, inputs)
        targets = np.full(batch, self.max_batch, np.int32)  # out of range: dropped
        targets[:len(joining)] = free[:len(joining)]
        keys = np.zeros((batch, 2), np.uint32)
        keys[:len(joining)] = [j.key for j in joining]
        self._kv.hold_block(length)
        self._kv.make_room(_lengths(slots), max(map(len, prompts)), 0)
        self._kv.cache, tokens, logprobs = self._prefill(
            self._params, self._kv.cache, model_inputs, jnp.asarray(targets),
            jnp.asarray(self._kv.index - length, jnp.int32), jnp.asarray(keys), settings)
        self.calls["prefill"] += 1
        tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
        n_real = mask.sum(-1)
        starts = decode_position_ids(deltas, n_real)[0, :, 0]
        for row, job in enumerate(joining):
            slot = _Slot(job, length=int(n_real[row]), position=int(starts[row]),
                         last_token=int(tokens[row]),
                         text=IncrementalText(self.tokenizer) if params.stop else None)
            slots[free[row]] = slot
            self._accept(free[row], slots, int(tokens[row]), float(logprobs[row]), params,
                         results, version)

    def _prepare_held(self, batch: int, inputs: dict) -> tuple[ModelInputs, np.ndarray]:
        """Model inputs whose vision buckets never shrink for a prefill batch size: the
        number of images varies from batch to batch, and each new vision shape would
        compile the prefill anew."""
        model_inputs, deltas = prepare_inputs(self.config, inputs, *self._vision_floor.get(batch, (1, 1)))
        if model_inputs.layout is not None:
            vision = self.config.vision
            slots_per_window = window_units(vision) ** 2 * vision.merge_unit
            self._vision_floor[batch] = (model_inputs.layout.patch_index.shape[0] // slots_per_window,
                                         model_inputs.layout.merged_index.shape[0])
        return model_inputs, deltas

    def _decode_chunk(self, slots: list[_Slot | None], settings: SamplingArrays,
                      params: SamplingParams, results: list[GenerationResult | None],
                      version: int) -> None:
        """Runs `decode_chunk` tokens for the first slots (a decode batch size holding every
        occupied one, moved to the front if needed) and hands each active slot its tokens."""
        steps = self.decode_chunk
        self._kv.make_room(_lengths(slots), 0, steps)
        occupied = [i for i, s in enumerate(slots) if s is not None]
        rows = smallest_bucket(len(occupied), self.decode_batches)
        if occupied[-1] >= rows:
            order = occupied + [i for i, s in enumerate(slots) if s is None]
            self._kv.permute_rows(np.asarray(order, np.int32))
            slots[:] = [slots[i] for i in order]
        running = slots[:rows]
        active = np.array([s is not None for s in running])
        tokens = np.array([s.last_token if s else 0 for s in running], np.int32)
        positions = np.array([s.position if s else 0 for s in running], np.int32)
        counts = np.array([len(s.token_ids) if s else 0 for s in running], np.int32)
        keys = np.stack([s.job.key if s else np.zeros(2, np.uint32) for s in running])
        self._kv.cache, new_tokens, new_logprobs = self._decode(
            self._params, self._kv.cache, jnp.asarray(tokens), jnp.asarray(positions),
            jnp.asarray(active), jnp.asarray(counts), jnp.asarray(keys), settings)
        self._kv.index += steps
        self.calls["decode"] += 1
        new_tokens, new_logprobs = np.asarray(new_tokens), np.asarray(new_logprobs)
        for i, slot in enumerate(running):
            if slot is None:
                continue
            slot.length += steps
            slot.position += steps
            for step in range(steps):
                slot.last_token = int(new_tokens[i, step])
                if self._accept(i, slots, slot.last_token, float(new_logprobs[i, step]),
                                params, results, version):
                    break

    def _accept(self, i: int, slots: list[_Slot | None], token: int, logprob: float,
                params: SamplingParams, results: list[GenerationResult | None],
                version: int) -> bool:
        """Appends one token to slot i; on a finish, records the result and frees the slot."""
        slot = slots[i]
        slot.token_ids.append(token)
        slot.logprobs.append(logprob)
        reason, matched = None, None
        if token in self.eos_token_ids or token in params.stop_token_ids:
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
        if reason is None:
            return False
        results[slot.job.index] = GenerationResult(
            tuple(slot.token_ids), tuple(slot.logprobs), reason, matched, version)
        slots[i] = None
        return True

    # ------------------------------------------------------------------ jitted functions

    def _prefill_impl(self, params: Any, cache: KVCache, inputs: ModelInputs,
                      targets: jax.Array, start: jax.Array, keys: jax.Array,
                      settings: SamplingArrays) -> tuple[KVCache, jax.Array, jax.Array]:
        """Runs left-padded prompts into a fresh cache, copies its rows into the slots
        `targets` at columns [start, start + length) and samples each first token.

        `start` may be negative as long as the real tokens fit before the write index: the
        leading padding columns then wrap to the end of the row, past the write index, as
        invalid columns that decoding overwrites."""
        self.trace_counts["prefill"] += 1
        batch, length = inputs.input_ids.shape
        fresh = KVCache.init(self.config, batch, length, self.cache_dtype)
        logits, fresh = forward(self.config, self.compute_dtype, params, inputs, fresh)
        token_keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(keys),
                                                   jnp.zeros(batch, jnp.int32))
        tokens, logprobs = sample_tokens(logits[:, -1], token_keys, settings)
        rows = targets[:, None]
        columns = (start + jnp.arange(length)[None, :]) % cache.max_length

        def place(big: jax.Array, small: jax.Array) -> jax.Array:
            """Stacked heads-major [L, B, KVH, S, d]: indexing puts (row, column) first."""
            small = small.transpose(1, 3, 0, 2, 4).astype(big.dtype)
            return big.at[:, rows, :, columns].set(small, mode="drop")

        valid = cache.valid.at[targets].set(False, mode="drop")
        valid = valid.at[rows, columns].set(fresh.valid, mode="drop")
        cache = KVCache(keys=place(cache.keys, fresh.keys), values=place(cache.values, fresh.values),
                        valid=valid, index=cache.index)
        return cache, tokens, logprobs

    def _decode_impl(self, params: Any, cache: KVCache, tokens: jax.Array, positions: jax.Array,
                     active: jax.Array, counts: jax.Array, keys: jax.Array,
                     settings: SamplingArrays) -> tuple[KVCache, jax.Array, jax.Array]:
        """`decode_chunk` steps for the first len(tokens) slots: feed each slot's last token,
        sample the next. The other rows of the cache are kept as they are."""
        self.trace_counts["decode"] += 1
        typed_keys = jax.random.wrap_key_data(keys)
        rows = tokens.shape[0]
        full = cache
        cache = KVCache(keys=full.keys[:, :rows], values=full.values[:, :rows],
                        valid=full.valid[:rows], index=full.index)

        def step(carry: tuple[KVCache, jax.Array], t: jax.Array):
            cache, last = carry
            pos = jnp.broadcast_to((positions + t)[None, :, None], (3, last.shape[0], 1))
            inputs = ModelInputs(input_ids=last[:, None], attention_mask=active[:, None],
                                 positions=pos)
            logits, cache = forward(self.config, self.compute_dtype, params, inputs, cache)
            step_keys = jax.vmap(jax.random.fold_in)(typed_keys, counts + t)
            new, logprobs = sample_tokens(logits[:, 0], step_keys, settings)
            return (cache, new), (new, logprobs)

        (cache, _), (new_tokens, logprobs) = jax.lax.scan(
            step, (cache, tokens), jnp.arange(self.decode_chunk, dtype=jnp.int32))
        cache = KVCache(keys=full.keys.at[:, :rows].set(cache.keys),
                        values=full.values.at[:, :rows].set(cache.values),
                        valid=full.valid.at[:rows].set(cache.valid), index=cache.index)
        return cache, new_tokens.T, logprobs.T


def _lengths(slots: list[_Slot | None]) -> list[int]:
    """Valid cache columns of every occupied slot."""
    return [s.length for s in slots if s is not None]
