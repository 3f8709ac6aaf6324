"""``JaxEngine.warm_up``: after it, a workload of fresh prompts of several batch sizes and
lengths, with and without images, continued turns (extension) and decoding at several
occupancies compiles nothing, and the tokens are those of an engine that never warmed up.

The tiny random Qwen2.5-VL; one length bucket and two prefill and decode batch sizes keep the
shapes few (the warm-up compiles each once)."""

import numpy as np
import pytest

from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.jax_engine import JaxEngine
from tests.rollout.tiny_model import image_tokens, random_image, random_params, text_ids

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.preset("tiny")
    return config, random_params(config, seed=0)


def make_engine(model, tokenizer):
    config, params = model
    return JaxEngine(
        config,
        params,
        tokenizer,
        max_batch=4,
        length_buckets=(128,),
        extension_buckets=(32,),
        decode_chunk=4,
        prefill_batch_sizes=(2, 4),
        min_cache_length=128,
        eos_token_ids=(),
        image_tokens_per_row=4,
    )


def with_image(config, tokenizer, text, seed):
    """Tokens of `text` and one 56 x 56 image (four merged tokens), and the image and grid."""
    image = random_image(seed)
    tokens, grid = image_tokens(config, image)
    return text_ids(tokenizer, text) + tokens, (image,), [grid]


def workload(engine, config, tokenizer):
    """Three calls: one text prompt alone (a prefill block of 2), three prompts, one with an
    image and token limits that end them at different steps (a block of 4, then decoding 4
    rows and 1), and those three continued, one turn adding an image (extension blocks)."""
    outputs = []
    first = GenerationRequest("solo", text_ids(tokenizer, "Count to three."))
    outputs += engine.generate([first], SAMPLING)
    ids, images, grids = with_image(config, tokenizer, "What is in this picture?", seed=1)
    turn = [
        GenerationRequest("a", ids, images=images, image_grid_thw=grids, max_new_tokens=2),
        GenerationRequest("b", text_ids(tokenizer, "A longer question about the weather today?")),
        GenerationRequest("c", text_ids(tokenizer, "Hi"), max_new_tokens=3),
    ]
    results = engine.generate(turn, SAMPLING)
    outputs += results
    more, new_images, new_grids = with_image(config, tokenizer, " And this one?", seed=2)
    nexts = []
    for request, result, (suffix, extra_images, extra_grids) in zip(
        turn,
        results,
        [(more, new_images, new_grids), (text_ids(tokenizer, " Go on."), (), []), (text_ids(tokenizer, " Ok"), (), [])],
    ):
        nexts.append(
            GenerationRequest(
                request.request_id,
                request.prompt_token_ids + result.token_ids + suffix,
                images=request.images + extra_images,
                image_grid_thw=np.concatenate([request.image_grid_thw, np.reshape(extra_grids, (-1, 3))]),
            )
        )
    outputs += engine.generate(nexts, SAMPLING)
    return outputs


def test_after_warm_up_the_workload_compiles_nothing_and_samples_the_same_tokens(model, tokenizer):
    config, _ = model
    warmed = make_engine(model, tokenizer)
    report = warmed.warm_up()
    compiled = warmed.compile_counts
    assert report.compiles == sum(compiled.values()) > 0
    assert all(compiled[name] > 0 for name in ("prefill", "extend", "decode", "compact", "swap"))
    assert not warmed.calls and not warmed.token_counts and warmed.held_slots == 0

    outputs = workload(warmed, config, tokenizer)

    assert warmed.compile_counts == compiled
    assert warmed.calls["extend"] > 0 and warmed.calls["prefill"] >= 2 and warmed.calls["decode"] > 1
    assert warmed.token_counts["reused"] > 0
    cold = make_engine(model, tokenizer)
    reference = workload(cold, config, tokenizer)
    assert [r.token_ids for r in outputs] == [r.token_ids for r in reference]
    np.testing.assert_allclose(
        np.concatenate([r.logprobs for r in outputs]), np.concatenate([r.logprobs for r in reference]), atol=1e-6
    )
    assert [len(r.token_ids) for r in outputs[1:4]] == [2, 6, 3]
