"""Several decode steps per dispatch: the compiled loop gives the tokens of one step per
dispatch under the same seeds, ends rows in the loop at stop ids and token limits, and stops
as soon as every row has ended."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.models import KVCache, ModelConfig, prepare_inputs
from pyvision_jax.rollout.cache_rows import prefill_rows
from pyvision_jax.rollout.decode_loop import decode_steps
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.prompt_block import prompt_block
from pyvision_jax.rollout.sampling import SamplingArrays
from tests.rollout.tiny_model import random_params, text_ids


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.preset("tiny")
    return config, random_params(config, seed=0)


def engine_with(model, tokenizer, steps, **kwargs):
    config, params = model
    return JaxEngine(
        config,
        params,
        tokenizer,
        max_batch=4,
        length_buckets=(64, 128),
        decode_chunk=steps,
        prefill_batch_sizes=(4,),
        min_cache_length=128,
        eos_token_ids=(),
        **kwargs,
    )


def test_many_steps_per_dispatch_sample_the_tokens_of_one_step_per_dispatch(model, tokenizer):
    """Temperature 1, top-k, mixed token limits, stop ids and a stop string, more requests than
    slots, two calls (the second continuing the held slots): same tokens, same finishes."""
    engines = {steps: engine_with(model, tokenizer, steps) for steps in (1, 8)}
    requests = [
        GenerationRequest(f"r{i}", text_ids(tokenizer, f"request {i} says"), max_new_tokens=limit)
        for i, limit in enumerate((5, 40, 17, 3, 29, 11))
    ]
    base = SamplingParams(temperature=1.0, top_k=50, max_new_tokens=40, seed=3)
    first = engines[1].generate(requests, base)
    stop_id = next(t for t in first[2].token_ids[4:] if t not in first[1].token_ids[:24])
    texts = [tokenizer.decode([t]) for t in first[1].token_ids]
    at = next(
        i
        for i in range(12, 30)
        if all(t < 2000 and x.strip() and x.isascii() for t, x in zip(first[1].token_ids[i : i + 2], texts[i : i + 2]))
    )
    stop = "".join(texts[at : at + 2])  # a string that the long request completes
    sampling = dataclasses.replace(base, stop=(stop,), stop_token_ids=(stop_id,))
    for call in range(2):
        results = {steps: engine.generate(requests, sampling) for steps, engine in engines.items()}
        for one, many in zip(results[1], results[8]):
            assert one.token_ids == many.token_ids and one.finish_reason == many.finish_reason
            assert one.stop_string == many.stop_string
            np.testing.assert_allclose(one.logprobs, many.logprobs, atol=1e-5, rtol=0)
        if call == 0:
            assert {r.finish_reason for r in results[8]} == {"eos", "stop", "length"}
        requests = [
            GenerationRequest(
                r.request_id,
                r.prompt_token_ids + out.token_ids + text_ids(tokenizer, " ok"),
                max_new_tokens=r.max_new_tokens,
            )
            for r, out in zip(requests, results[8])
        ]
    assert engines[8].calls["decode"] < engines[1].calls["decode"]
    assert engines[1].calls["decode"] == engines[1].calls["decode_steps"]


def test_a_dispatch_stops_when_every_row_has_ended(model, tokenizer):
    """Token limits of 3 and 5 need 4 decode steps (token 0 comes from the prefill): one
    dispatch of 4 steps out of 8. A stop id drawn at token k ends the row after k steps."""
    engine = engine_with(model, tokenizer, 8, kv_continuation=False)
    requests = [
        GenerationRequest("a", text_ids(tokenizer, "first"), max_new_tokens=3),
        GenerationRequest("b", text_ids(tokenizer, "second"), max_new_tokens=5),
    ]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    results = engine.generate(requests, greedy)
    assert [len(r.token_ids) for r in results] == [3, 5]
    assert engine.calls["decode"] == 1 and engine.calls["decode_steps"] == 4
    [free] = engine.generate([GenerationRequest("c", text_ids(tokenizer, "third"))], greedy)
    k = next(k for k in range(2, 20) if free.token_ids[k] not in free.token_ids[:k])
    steps = engine.calls["decode_steps"]
    [ended] = engine.generate(
        [GenerationRequest("c", text_ids(tokenizer, "third"))],
        SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=(free.token_ids[k],)),
    )
    assert ended.token_ids == free.token_ids[: k + 1] and ended.finish_reason == "eos"
    assert engine.calls["decode_steps"] - steps == k


def test_rows_that_end_in_the_loop_write_no_more_valid_columns(model, tokenizer):
    """Two rows, limits 2 and 8 tokens from now: the loop runs 8 steps, the first row draws 2
    tokens and its cache row gains exactly 2 valid columns (the tokens it fed)."""
    config, params = model
    inputs, _, length = prompt_block(
        config,
        [text_ids(tokenizer, "row zero"), text_ids(tokenizer, "row one")],
        [None, None],
        [np.zeros((0, 3))] * 2,
        (16,),
        (2,),
    )
    model_inputs, deltas = prepare_inputs(config, inputs)
    cache = KVCache.init(config, 2, 64).replace(index=jnp.asarray(16, jnp.int32))
    settings = SamplingArrays.create(1.0, 0, 1.0)
    keys = jnp.arange(4, dtype=jnp.uint32).reshape(2, 2)
    cache, first, _ = prefill_rows(
        config, "float32", params, cache, model_inputs, jnp.array([0, 1]), jnp.asarray(0), keys, settings
    )
    before = np.asarray(cache.valid).sum(1)
    real = inputs["attention_mask"].sum(1)
    cache, tokens, _, drawn, steps = decode_steps(
        config,
        "float32",
        8,
        params,
        cache,
        first,
        jnp.asarray(real + deltas),
        jnp.array([True, True]),
        jnp.array([1, 1]),
        jnp.array([3, 9]),
        keys,
        jnp.zeros(config.vocab_size, bool),
        settings,
    )
    assert int(steps) == 8 and np.asarray(drawn).tolist() == [2, 8]
    assert (np.asarray(cache.valid).sum(1) - before).tolist() == [2, 8]
    assert int(cache.index) == 16 + 8


def test_attending_to_the_live_span_samples_what_attending_to_the_whole_cache_samples(model, tokenizer):
    """Short contexts in a long cache, more requests than slots and a continuation call: the
    dispatches attend to a window of the cache's last columns (fewer than it has), with the
    same tokens and logprobs (<= 1e-5) as dispatches over the whole cache."""
    engines = {live: engine_with(model, tokenizer, 8, live_span=live) for live in (False, True)}
    requests = [
        GenerationRequest(f"r{i}", text_ids(tokenizer, f"request {i} says"), max_new_tokens=limit)
        for i, limit in enumerate((5, 30, 17, 3, 25, 11))
    ]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    spans = []
    engine = engines[True]
    span = engine._kv.span
    engine._kv.span = lambda longest: spans.append(span(longest)) or spans[-1]
    for _ in range(2):
        results = {live: e.generate(requests, sampling) for live, e in engines.items()}
        for whole, live in zip(results[False], results[True]):
            assert whole.token_ids == live.token_ids and whole.finish_reason == live.finish_reason
            np.testing.assert_allclose(whole.logprobs, live.logprobs, atol=1e-5, rtol=0)
        requests = [
            GenerationRequest(
                r.request_id, r.prompt_token_ids + out.token_ids + text_ids(tokenizer, " ok"), max_new_tokens=20
            )
            for r, out in zip(requests, results[True])
        ]
    cache_length = engine._kv.cache.max_length
    assert min(spans) < cache_length, (spans, cache_length)
