"""The Engine protocol's data types and the scripted engine's conformance to it."""

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.agent.engine import Engine, GenerationRequest, GenerationResult, SamplingParams
from pyvision_jax.rollout.scripted_engine import ScriptedEngine

PAD, IM_END = 2012, 2002


def test_sampling_params_validate_their_fields():
    params = SamplingParams(stop=("</code>",), max_new_tokens=8)
    assert params.temperature == 1.0 and params.stop == ("</code>",)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(TypeError, match="tuple of strings"):
        SamplingParams(stop="</code>")


def test_requests_check_images_against_grids_and_cap_tokens():
    image = Image.new("RGB", (56, 56))
    request = GenerationRequest("r", (1, PAD, 2), images=(image,), image_grid_thw=[1, 4, 4], max_new_tokens=5)
    assert request.image_grid_thw.shape == (1, 3)
    assert request.token_limit(SamplingParams(max_new_tokens=10)) == 5
    assert request.token_limit(SamplingParams(max_new_tokens=3)) == 3
    assert GenerationRequest("r", (1,)).token_limit(SamplingParams(max_new_tokens=3)) == 3
    with pytest.raises(ValueError, match="1 images but 0 rows"):
        GenerationRequest("r", (1,), images=(image,))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        GenerationRequest("r", (1,), max_new_tokens=0)


def test_results_keep_tokens_and_logprobs_aligned():
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        GenerationResult((1, 2), (-0.1,), "eos")
    with pytest.raises(ValueError, match="finish_reason"):
        GenerationResult((1,), (-0.1,), "done")


def test_scripted_engine_follows_the_protocol_conventions(tokenizer):
    engine = ScriptedEngine(
        tokenizer, {"a": ["think <code>\nx\n</code> never seen", "final"], "b": ["word " * 50]}, version=3
    )
    assert isinstance(engine, Engine)
    params = SamplingParams(stop=("</code>",), max_new_tokens=20)
    stop, long = engine.generate([GenerationRequest("a/0", (1,)), GenerationRequest("b/0", (1,))], params)
    assert stop.finish_reason == "stop" and stop.stop_string == "</code>"
    assert tokenizer.decode(list(stop.token_ids)) == "think <code>\nx\n</code>"
    assert long.finish_reason == "length" and len(long.token_ids) == 20
    assert stop.policy_version == 3 and len(stop.logprobs) == len(stop.token_ids)
    assert all(lp < 0 for lp in stop.logprobs)
    (eos,) = engine.generate([GenerationRequest("a/0", (1,))], params)
    assert eos.finish_reason == "eos" and eos.token_ids[-1] == IM_END
    engine.update_weights(None, 9)
    assert engine.version == 9
    assert engine.calls == [("a/0", "b/0"), ("a/0",)]


def test_scripted_engine_rejects_image_token_mismatches(tokenizer):
    engine = ScriptedEngine(tokenizer, {"a": ["x"]})
    request = GenerationRequest(
        "a/0", (PAD,) * 3, images=(Image.new("RGB", (56, 56)),), image_grid_thw=np.array([[1, 4, 4]])
    )
    with pytest.raises(ValueError, match="3 image-pad tokens .* account for 4"):
        engine.generate([request], SamplingParams())
    with pytest.raises(KeyError, match="no script for request 'zzz/0'"):
        engine.generate([GenerationRequest("zzz/0", (1,))], SamplingParams())
