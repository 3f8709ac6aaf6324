"""The embedded JAX engine against the model's full forward pass (tiny random Qwen2.5-VL).

One engine serves the whole module with one length bucket, one prefill batch size and a fixed
cache size, so the module compiles each jitted function once (text and image prefill, decode,
compact); the full-forward references are padded to one length for the same reason.
"""

import dataclasses
import io

import jax
import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open

from pyvision_jax.agent.engine import Engine, GenerationRequest, SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.convert import save_hf
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig, logits
from pyvision_jax.processing import preprocess_images
from pyvision_jax.rollout.engine_placement import placements
from pyvision_jax.rollout.incremental_text import IncrementalText
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.sampling import SamplingArrays, sampling_log_probs
from tests.agent.fake_sandbox import FakePool
from tests.rollout.tiny_model import random_params, text_ids

CHUNK = 4
REFERENCE_LENGTH = 512
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.preset("tiny")
    return config, random_params(config, seed=0)


def build_engine(model, tokenizer) -> JaxEngine:
    config, params = model
    return JaxEngine(
        config,
        params,
        tokenizer,
        max_batch=4,
        length_buckets=(512,),
        decode_chunk=CHUNK,
        prefill_batch_sizes=(4,),
        min_cache_length=512,
        eos_token_ids=(),
        version=3,
    )


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return build_engine(model, tokenizer)


def image_request(config, tokenizer, request_id="img", seed=0):
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8))
    ids = (
        text_ids(tokenizer, "Look at this picture:")
        + (config.vision_start_token_id,)
        + (config.image_token_id,) * 4
        + (config.vision_end_token_id,)
        + text_ids(tokenizer, " What is in it?")
    )
    return GenerationRequest(request_id, ids, images=(image,), image_grid_thw=[(1, 4, 4)])


def reference_logits(config, params, token_ids, images=(), grids=None):
    """Full-forward float32 logits [len(token_ids), V], right-padded to a fixed length."""
    length = REFERENCE_LENGTH
    ids = np.full((1, length), config.pad_token_id, np.int32)
    mask = np.zeros((1, length), bool)
    ids[0, : len(token_ids)], mask[0, : len(token_ids)] = token_ids, True
    inputs = {"input_ids": ids, "attention_mask": mask}
    if images:
        inputs["pixel_values"], inputs["image_grid_thw"] = preprocess_images(
            list(images), min_pixels=56 * 56, max_pixels=56 * 56
        )
        np.testing.assert_array_equal(inputs["image_grid_thw"], grids)
    return np.asarray(logits(config, params, inputs))[0, : len(token_ids)]


def generated_logits(config, params, request, result):
    """Full-forward logits at the positions that predicted each generated token."""
    full = request.prompt_token_ids + result.token_ids
    out = reference_logits(config, params, full, request.images, request.image_grid_thw)
    start = len(request.prompt_token_ids) - 1
    return out[start : start + len(result.token_ids)]


def assert_greedy(config, params, request, result):
    expected = generated_logits(config, params, request, result).argmax(-1)
    np.testing.assert_array_equal(np.array(result.token_ids), expected)


def test_engine_implements_the_protocol(engine):
    assert isinstance(engine, Engine)
    assert engine.version == 3


def test_greedy_text_equals_argmax_of_full_forward(model, tokenizer, engine):
    config, params = model
    requests = [
        GenerationRequest("a", text_ids(tokenizer, "print the answer to the question")),
        GenerationRequest("b", text_ids(tokenizer, "x = 1")),
    ]
    results = engine.generate(requests, GREEDY)
    for request, result in zip(requests, results):
        assert len(result.token_ids) == 12 and result.finish_reason == "length"
        assert result.policy_version == 3
        assert_greedy(config, params, request, result)


def test_greedy_image_prompt_equals_argmax_of_full_forward(model, tokenizer, engine):
    config, params = model
    request = image_request(config, tokenizer)
    [result] = engine.generate([request], GREEDY)
    assert_greedy(config, params, request, result)
    # the image matters: another image gives another continuation's logits
    other = image_request(config, tokenizer, seed=1)
    [other_result] = engine.generate([other], GREEDY)
    assert not np.allclose(
        generated_logits(config, params, request, result)[0], generated_logits(config, params, other, other_result)[0]
    )


def test_logprobs_are_log_softmax_of_full_forward_at_temperature_one(model, tokenizer, engine):
    config, params = model
    requests = [GenerationRequest("t", text_ids(tokenizer, "def crop(image):")), image_request(config, tokenizer)]
    results = engine.generate(requests, SamplingParams(temperature=1.0, max_new_tokens=10, seed=5))
    for request, result in zip(requests, results):
        log_probs = jax.nn.log_softmax(generated_logits(config, params, request, result), -1)
        expected = np.asarray(log_probs)[np.arange(len(result.token_ids)), result.token_ids]
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-4, rtol=0)


def test_batch_of_different_lengths_equals_each_prompt_alone(model, tokenizer, engine):
    config, _ = model
    requests = [
        GenerationRequest("short", text_ids(tokenizer, "hi")),
        image_request(config, tokenizer, "image"),
        GenerationRequest(
            "long", text_ids(tokenizer, "a much longer prompt with many more words in it than the others")
        ),
    ]
    together = engine.generate(requests, GREEDY)
    for request, result in zip(requests, together):
        [alone] = engine.generate([request], GREEDY)
        assert alone.token_ids == result.token_ids
        np.testing.assert_allclose(alone.logprobs, result.logprobs, atol=1e-4)


def test_continuous_batching_completes_every_request_without_recompiling(model, tokenizer, engine):
    config, params = model
    engine.generate([GenerationRequest("warm", text_ids(tokenizer, "warm up"))], GREEDY)
    traces, compiled = dict(engine.trace_counts), engine.compile_counts
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    requests = [
        GenerationRequest(f"r{i}", text_ids(tokenizer, " ".join(words[: i + 1])), max_new_tokens=3 + 2 * i)
        for i in range(9)
    ]
    results = engine.generate(requests, SamplingParams(temperature=0.0, max_new_tokens=20))
    for i, (request, result) in enumerate(zip(requests, results)):
        assert len(result.token_ids) == 3 + 2 * i and result.finish_reason == "length"
        assert_greedy(config, params, request, result)
    assert dict(engine.trace_counts) == traces and engine.compile_counts == compiled
    assert engine.compile_counts["decode"] == 1 and engine.compile_counts["compact"] <= 1


def test_stragglers_decode_in_a_smaller_batch_moved_to_the_front(model, tokenizer):
    """Slots 0-2 end after one chunk; slot 3 goes on alone in a decode batch of 1 (its cache
    row moved to row 0), with the tokens the full batch would have given it."""
    config, params = model
    small = JaxEngine(
        config,
        params,
        tokenizer,
        max_batch=4,
        length_buckets=(512,),
        decode_chunk=CHUNK,
        prefill_batch_sizes=(4,),
        decode_batch_sizes=(1, 4),
        min_cache_length=512,
        eos_token_ids=(),
    )
    requests = [
        GenerationRequest(f"q{i}", text_ids(tokenizer, f"question {i} about it"), max_new_tokens=limit)
        for i, limit in enumerate((3, 2, 4, 17))
    ]
    for attempt in range(2):  # the second call continues the held slots, wherever they moved
        results = small.generate(requests, SamplingParams(temperature=0.0, max_new_tokens=20))
        for request, result in zip(requests, results):
            assert len(result.token_ids) == request.max_new_tokens
            assert_greedy(config, params, request, result)
        assert small.calls["swap"] == 1 and small.calls["extend"] == attempt
        assert small.compile_counts["decode"] == 2 and small.compile_counts["swap"] == 1
    with pytest.raises(ValueError, match="decode_batch_sizes"):
        JaxEngine(config, params, tokenizer, max_batch=4, decode_batch_sizes=(1, 2))


def test_long_generations_compact_the_cache_and_later_joins_stay_correct(model, tokenizer):
    """More tokens than the cache's columns: rows are compacted left while others join. An
    engine of its own: contexts other tests leave held would change when compaction is due."""
    config, params = model
    engine = build_engine(model, tokenizer)
    limits = (400, 160, 100, 100, 450, 120)  # the 450 joins late and ends after column 516
    requests = [
        GenerationRequest(f"long{i}", text_ids(tokenizer, f"request number {i}"), max_new_tokens=limit)
        for i, limit in enumerate(limits)
    ]
    results = engine.generate(requests, SamplingParams(temperature=0.0, max_new_tokens=450))
    assert engine.calls["compact"] >= 2 and engine.calls["grow"] == 0
    for request, result, limit in zip(requests, results, limits):
        assert len(result.token_ids) == limit
        assert_greedy(config, params, request, result)


def test_stop_string_of_several_tokens_is_kept(tokenizer, engine):
    request = GenerationRequest("s", text_ids(tokenizer, "the result is"))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=4)
    [free] = engine.generate([request], sampling)
    texts = [tokenizer.decode([t]) for t in free.token_ids]
    clean = [t < 2000 and text.strip() and text.isascii() for t, text in zip(free.token_ids, texts)]
    start = next(i for i in range(2, 20) if all(clean[i : i + 3]))
    stop = "".join(texts[start : start + 3])
    end = next(k for k in range(len(free.token_ids)) if stop in tokenizer.decode(free.token_ids[: k + 1]))
    [result] = engine.generate([request], dataclasses.replace(sampling, stop=("never appears", stop)))
    assert result.finish_reason == "stop" and result.stop_string == stop
    assert result.token_ids == free.token_ids[: end + 1]
    assert result.logprobs == pytest.approx(free.logprobs[: end + 1], abs=1e-5)
    assert stop in tokenizer.decode(result.token_ids)
    assert stop not in tokenizer.decode(result.token_ids[-1:])  # it spans several tokens


def test_stop_token_ids_end_with_eos_and_limits_with_length(tokenizer, engine):
    request = GenerationRequest("e", text_ids(tokenizer, "answer:"))
    [free] = engine.generate([request], SamplingParams(temperature=0.0, max_new_tokens=16))
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    [eos] = engine.generate([request], SamplingParams(temperature=0.0, max_new_tokens=16, stop_token_ids=(stop_id,)))
    assert eos.finish_reason == "eos" and eos.token_ids == free.token_ids[: first + 1]
    assert eos.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-5)
    short = GenerationRequest("e", request.prompt_token_ids, max_new_tokens=2)
    [limited] = engine.generate([short], SamplingParams(temperature=0.0, max_new_tokens=16))
    assert limited.finish_reason == "length" and limited.token_ids == free.token_ids[:2]


def test_seeds_reproduce_and_filters_reach_greedy(tokenizer, engine):
    requests = [GenerationRequest(f"g/{k}", text_ids(tokenizer, "sample me")) for k in range(3)]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    first = engine.generate(requests, sampled)
    again = engine.generate(requests[::-1], sampled)[::-1]
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert len({r.token_ids for r in first}) == 3  # each rollout has its own stream
    other = engine.generate(requests, SamplingParams(temperature=1.0, max_new_tokens=12, seed=12))
    assert [r.token_ids for r in other] != [r.token_ids for r in first]
    [greedy] = engine.generate(requests[:1], SamplingParams(temperature=0.0, max_new_tokens=12))
    for filtered in (
        SamplingParams(top_k=1, max_new_tokens=12, seed=3),
        SamplingParams(top_p=1e-6, max_new_tokens=12, seed=3),
    ):
        [result] = engine.generate(requests[:1], filtered)
        assert result.token_ids == greedy.token_ids
        np.testing.assert_allclose(result.logprobs, 0.0, atol=1e-6)


def test_filtered_log_probs_are_renormalised_over_kept_tokens():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    log_probs = jax.jit(sampling_log_probs)
    top2 = np.exp(log_probs(logits, SamplingArrays.create(1.0, 2, 1.0)))
    np.testing.assert_allclose(top2, [[0.625, 0.375, 0, 0]], atol=1e-6)
    top_p = np.exp(log_probs(logits, SamplingArrays.create(1.0, 0, 0.7)))
    np.testing.assert_allclose(top_p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    tempered = log_probs(logits, SamplingArrays.create(0.5, 0, 1.0))
    np.testing.assert_allclose(tempered, jax.nn.log_softmax(logits / 0.5, -1), atol=1e-6)


def test_update_weights_changes_outputs_and_version(model, tokenizer, engine):
    config, params = model
    request = GenerationRequest("w", text_ids(tokenizer, "weights"))
    [before] = engine.generate([request], GREEDY)
    traces, compiled = dict(engine.trace_counts), engine.compile_counts
    new_params = random_params(config, seed=1)
    assert engine.held_slots > 0
    engine.update_weights(new_params, version=4)
    assert engine.held_slots == 0  # KV of the old weights is never continued
    try:
        [after] = engine.generate([request], GREEDY)
        assert after.policy_version == 4 and engine.version == 4
        assert after.token_ids != before.token_ids
        assert_greedy(config, new_params, request, after)
        assert dict(engine.trace_counts) == traces and engine.compile_counts == compiled
    finally:
        engine.update_weights(params, version=3)
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights(jax.tree.map(lambda x: np.asarray(x)[..., :1], params), version=5)


def test_weights_on_a_one_device_mesh_are_placed_as_a_checkpoints_are():
    """The trainer's engine (weights on a one-device mesh) and the held-out evaluation's (a
    checkpoint's arrays) hold equally placed, committed weights and caches, so their
    executables have the same persistent-cache keys."""
    params = random_params(ModelConfig.preset("tiny"), seed=0)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    on_mesh = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    (from_checkpoint, cache), (from_mesh, mesh_cache) = (
        placements(jax.tree.map(lambda x: jax.numpy.asarray(np.asarray(x)), params)),
        placements(on_mesh),
    )
    assert cache == mesh_cache == jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for a, b in zip(jax.tree.leaves(from_checkpoint), jax.tree.leaves(from_mesh)):
        assert a.committed and b.committed and a.sharding == b.sharding == cache
        np.testing.assert_array_equal(a, b)


def test_committed_weights_from_a_trainer_reuse_the_compiled_executables(model, tokenizer):
    """A trainer's weights are committed to their devices; an engine built from uncommitted
    ones (a checkpoint's numpy arrays) runs them on the executables it already compiled."""
    config, params = model
    engine = JaxEngine(config, jax.tree.map(np.asarray, params), tokenizer, max_batch=2)
    request = GenerationRequest("c", text_ids(tokenizer, "committed"), max_new_tokens=4)
    engine.generate([request], GREEDY)
    compiled = engine.compile_counts
    trained = jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), random_params(config, seed=2))
    engine.update_weights(trained, version=1)
    [after] = engine.generate([request], GREEDY)
    assert_greedy(config, trained, request, after)
    assert engine.compile_counts == compiled


def test_update_weights_takes_named_hf_tensors(model, engine, tmp_path):
    """The iterator form (Hub names, HF layouts), as a safetensors checkpoint yields it."""
    config, params = model
    new_params = random_params(config, seed=2)
    checkpoint = save_hf(config, new_params, tmp_path / "hf", progress=False)
    with safe_open(str(checkpoint / "model.safetensors"), framework="np") as f:
        named = [(name, f.get_tensor(name)) for name in f.keys()]
    engine.update_weights(iter(named), version=6)
    try:
        assert engine.version == 6
        jax.tree.map(np.testing.assert_array_equal, engine.params, new_params)
    finally:
        engine.update_weights(params, version=3)


def test_bad_requests_are_named(model, tokenizer, engine):
    config, _ = model
    too_long = GenerationRequest("too-long", (5,) * 505, max_new_tokens=100)
    with pytest.raises(ValueError, match="too-long"):
        engine.generate([too_long], GREEDY)
    image = image_request(config, tokenizer, "wrong-grid")
    wrong = GenerationRequest("wrong-grid", image.prompt_token_ids, images=image.images, image_grid_thw=[(1, 4, 8)])
    with pytest.raises(ValueError, match="wrong-grid"):
        engine.generate([wrong], GREEDY)


def test_incremental_text_holds_back_incomplete_characters(tokenizer):
    ids = tokenizer.encode("é café", add_special_tokens=False)
    text = IncrementalText(tokenizer)
    for token in ids:
        text.append(token)
        assert "\ufffd" not in text.text
    assert text.text == "é café"


def test_engine_drives_a_multi_turn_episode(model, tokenizer, engine, tmp_path):
    """The episode runner on the JAX engine: every even token id ends a turn, malformed turns
    get format feedback, and the trajectory's logprobs are the full forward's."""
    config, params = model
    path = tmp_path / "task.png"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(path)
    task = Task(
        id="img",
        question="What colour is the square?",
        answer="A",
        answer_type="multiple_choice",
        data_source="test",
        image_path=str(path),
        options=("red", "blue"),
    )
    runner = EpisodeRunner(
        engine,
        tokenizer,
        FakePool(),
        EpisodeConfig(max_tool_calls=1, max_new_tokens_per_turn=6, max_total_tokens=500, on_error="feedback"),
        SamplingParams(temperature=1.0, seed=2, stop_token_ids=tuple(range(0, 2048, 2))),
    )
    [trajectory] = runner.run_trajectories([(task, 0)])
    assert trajectory.end_reason is EndReason.EXCEED_MAX_TURNS
    assert len(trajectory.turns) == 2 and trajectory.policy_version == 3
    ids, mask = np.array(trajectory.token_ids), np.array(trajectory.loss_mask, bool)
    assert mask.sum() >= 2 and not mask[: trajectory.prompt_length].any()
    images = [Image.open(io.BytesIO(im.png)) for im in trajectory.images]
    out = reference_logits(config, params, tuple(ids), images, np.array([im.grid_thw for im in trajectory.images]))
    log_probs = np.asarray(jax.nn.log_softmax(out, -1))
    positions = np.nonzero(mask)[0]
    np.testing.assert_allclose(
        np.array(trajectory.logprobs)[positions], log_probs[positions - 1, ids[positions]], atol=2e-4
    )
