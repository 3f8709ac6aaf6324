"""KV cache continuation: a turn appended to the context a cache row holds gives the logits of
a prefill of the whole context, images and M-RoPE positions included; and the engine that
continues its held slots samples what the engine that prefills every prompt in full samples.

The tiny random Qwen2.5-VL in float32; each episode has three turns, each adding images.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.agent.engine import GenerationRequest, SamplingParams
from pyvision_jax.models import KVCache, ModelConfig, logits, prepare_inputs, unstack_layers
from pyvision_jax.models.rope_index import decode_position_ids
from pyvision_jax.processing import preprocess_images
from pyvision_jax.rollout.cache_rows import extend_rows, prefill_rows
from pyvision_jax.rollout.decode_loop import decode_steps
from pyvision_jax.rollout.held_context import HeldContext, reusable_prefix
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.prompt_block import prompt_block, suffix_positions
from pyvision_jax.rollout.sampling import SamplingArrays
from pyvision_jax.rollout.slot_cache import compact_columns
from tests.rollout.tiny_model import image_tokens, random_image, random_params, text_ids

GREEDY = SamplingArrays.create(0.0, 0, 1.0)
BLOCK = 64
COLUMNS = 256


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.preset("tiny")
    return config, random_params(config, seed=0)


def with_images(config, tokenizer, text_before, images, text_after):
    """Tokens of `text_before`, each image's placeholder tokens, `text_after`; the grids."""
    ids, grids = text_ids(tokenizer, text_before), []
    for image in images:
        tokens, grid = image_tokens(config, image)
        ids, grids = ids + tokens, grids + [grid]
    return ids + text_ids(tokenizer, text_after), grids


def patches(images):
    return preprocess_images(list(images), min_pixels=56 * 56, max_pixels=112 * 112)[0] if images else None


def full_prefill_logits(config, params, request):
    """Logits [T, V] of the model's forward pass (no cache) over the whole prompt,
    left-padded to one block length."""
    inputs, _, length = prompt_block(
        config, [request.prompt_token_ids], [patches(request.images)], [request.image_grid_thw], (2 * BLOCK,), (1,)
    )
    return np.asarray(logits(config, params, inputs))[0, length - len(request.prompt_token_ids) :]


def row_keys(cache, row):
    """Every layer's keys of one cache row, stacked."""
    return np.stack([np.asarray(keys[row]) for keys in cache.keys])


def test_three_turns_with_images_continue_with_the_logits_of_a_full_prefill(model, tokenizer):
    """Row 1 holds an episode; each turn appends the last token, a tool response with new
    images and the next prompt to its context. The appended block's logits equal the full
    prefill's at every new token (<= 1e-5); the other row is left as it was. The engine's
    functions run on the per-layer weights it holds; the reference is the forward pass."""
    config, params = model
    layered = unstack_layers(params)
    images = [random_image(k, size) for k, size in enumerate([(56, 56), (56, 112), (112, 56), (56, 56)])]
    prompt, grids = with_images(config, tokenizer, "Question about", images[:1], " the picture?")
    turn_images = [images[:1], images[1:2], images[2:]]
    cache = KVCache.init(config, 2, COLUMNS).replace(index=jnp.asarray(160, jnp.int32))
    other = prompt_block(config, [text_ids(tokenizer, "another row")], [None], [np.zeros((0, 3))], (BLOCK,), (1,))[0]
    other_inputs, _ = prepare_inputs(config, other)
    keys = jnp.zeros((1, 2), jnp.uint32)
    cache, _, _ = prefill_rows(
        config, "float32", layered, cache, other_inputs, jnp.array([0]), jnp.asarray(160 - BLOCK), keys, GREEDY
    )
    request = GenerationRequest("e", prompt, images=tuple(turn_images[0]), image_grid_thw=grids)
    inputs, _, _ = prompt_block(config, [prompt], [patches(turn_images[0])], [np.array(grids)], (BLOCK,), (1,))
    model_inputs, deltas = prepare_inputs(config, inputs)
    cache, first, _ = prefill_rows(
        config, "float32", layered, cache, model_inputs, jnp.array([1]), jnp.asarray(160 - BLOCK), keys, GREEDY
    )
    position = int(decode_position_ids(deltas, [len(prompt)])[0, 0, 0])
    for turn in (1, 2):
        # six tokens decoded into row 1 (row 0 inactive)
        cache, drawn_tokens, _, drawn, _ = decode_steps(
            config,
            "float32",
            6,
            layered,
            cache,
            jnp.array([0, int(first[0])]),
            jnp.array([0, position]),
            jnp.array([False, True]),
            jnp.array([0, 1]),
            jnp.array([0, 7]),
            jnp.zeros((2, 2), jnp.uint32),
            jnp.zeros(config.vocab_size, bool),
            GREEDY,
        )
        assert int(drawn[1]) == 6
        generated = (int(first[0]),) + tuple(int(t) for t in drawn_tokens[1])
        held = HeldContext(
            "e",
            np.asarray(request.prompt_token_ids + generated[:-1]),
            request.images,
            request.image_grid_thw,
            used=turn,
        )
        if turn == 2:  # the slot cache compacts every row to a new write index in between
            kept = jnp.array([int(other["attention_mask"].sum()), len(held.token_ids)])
            cache = compact_columns(cache, kept, jnp.asarray(200), COLUMNS).replace(index=jnp.asarray(200, jnp.int32))
        before_other = row_keys(cache, 0)
        ids, grids = with_images(config, tokenizer, " tool output:", turn_images[turn], " next step?")
        request = GenerationRequest(
            "e",
            request.prompt_token_ids + generated + ids,
            images=request.images + tuple(turn_images[turn]),
            image_grid_thw=np.concatenate([request.image_grid_thw, grids]),
        )
        reused, reused_images = reusable_prefix(held, request, config.image_token_id, 2)
        assert (reused, reused_images) == (len(held.token_ids), turn)
        suffix = request.prompt_token_ids[reused:]
        inputs, batch, length = prompt_block(config, [suffix], [patches(turn_images[turn])], [grids], (BLOCK,), (1,))
        inputs["position_ids"], [position] = suffix_positions(config, [request], [reused], batch, length)
        model_inputs, _ = prepare_inputs(config, inputs)
        cache, logits, first, _ = extend_rows(
            config, "float32", layered, cache, model_inputs, jnp.array([1]), jnp.array([reused]), keys, GREEDY
        )
        expected = full_prefill_logits(config, params, request)[reused:]
        np.testing.assert_allclose(np.asarray(logits)[0, -len(suffix) :], expected, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(row_keys(cache, 0), before_other)
        assert int(np.asarray(cache.valid[1]).sum()) == len(request.prompt_token_ids)


class Episode:
    """An episode's growing context: each turn appends the generated tokens, a tool response
    with new images and the next prompt."""

    def __init__(self, config, tokenizer, name, images):
        self.config, self.tokenizer, self.name = config, tokenizer, name
        ids, grids = with_images(config, tokenizer, f"Task {name}:", images, " answer?")
        self.request = GenerationRequest(name, ids, images=tuple(images), image_grid_thw=np.reshape(grids, (-1, 3)))

    def advance(self, result, images):
        ids, grids = with_images(self.config, self.tokenizer, " tool output:", images, " go on")
        r = self.request
        self.request = GenerationRequest(
            r.request_id,
            r.prompt_token_ids + result.token_ids + ids,
            images=r.images + tuple(images),
            image_grid_thw=np.concatenate([r.image_grid_thw, np.reshape(grids, (-1, 3))]),
        )


def test_engine_with_continuation_samples_what_full_prefills_sample(model, tokenizer):
    """The same calls on two engines, one continuing held slots, one prefilling every prompt:
    episode A waits (its slot kept) while B's turn runs, A continues, then two new episodes
    take both slots and A's third turn is prefilled in full. Same tokens, logprobs within
    1e-5; only the continuing engine reuses tokens."""
    config, params = model
    engines = {
        on: JaxEngine(
            config,
            params,
            tokenizer,
            max_batch=2,
            length_buckets=(128, 256),
            decode_chunk=4,
            prefill_batch_sizes=(2,),
            min_cache_length=256,
            eos_token_ids=(),
            kv_continuation=on,
        )
        for on in (True, False)
    }
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7, stop_token_ids=tuple(range(0, 2048, 13)))
    image = [random_image(k, (56, 56 * (1 + k % 2))) for k in range(5)]
    episodes = {
        on: {name: Episode(config, tokenizer, name, image[:1] if name == "A" else []) for name in "ABCD"}
        for on in (True, False)
    }
    turn_images = {"A": [image[1:2], image[2:4]], "B": [[], image[4:]]}
    schedule = [("A", "B"), ("B",), ("A",), ("C", "D"), ("A", "B")]
    reused = []
    for call in schedule:
        outputs = {}
        for on, engine in engines.items():
            requests = [episodes[on][name].request for name in call]
            outputs[on] = engine.generate(requests, sampling)
        for name, with_cache, without in zip(call, outputs[True], outputs[False]):
            assert with_cache.token_ids == without.token_ids
            np.testing.assert_allclose(with_cache.logprobs, without.logprobs, atol=1e-5, rtol=0)
            turn = sum(name in c for c in schedule[: schedule.index(call)])
            if name in turn_images and turn < 2:
                for on in engines:
                    episodes[on][name].advance(with_cache, turn_images[name][turn])
        reused.append(engines[True].token_counts["reused"])
    on, off = engines[True], engines[False]
    assert on.calls["extend"] == 2 and off.calls["extend"] == 0 and off.token_counts["reused"] == 0
    assert reused[0] == 0 < reused[1] < reused[2] == reused[3] == reused[4]  # B, then A; none after eviction
    assert on.token_counts["prefilled"] + on.token_counts["reused"] == off.token_counts["prefilled"]
    assert on.held_slots == 2 and off.held_slots == 0


def test_reusable_prefix_stops_at_a_difference_and_never_splits_an_image(tokenizer):
    config = ModelConfig.preset("tiny")
    first, second = random_image(0), random_image(1)
    pads, grid = image_tokens(config, first)  # start, 4 pads, end
    ids = (5, 6) + pads + (7, 8) + pads + (9,)
    request = GenerationRequest("e", ids, images=(first, second), image_grid_thw=[grid, grid])

    def reuse(held_ids, images=(first, second)):
        held = HeldContext("e", np.asarray(held_ids), images, np.array([grid, grid][: len(images)]), used=0)
        return reusable_prefix(held, request, config.image_token_id, 2)

    assert reuse(ids) == (len(ids) - 1, 2)  # the same prompt: all but its last token
    assert reuse(ids[:9] + (0,)) == (9, 1)  # a token differs after the first image
    assert reuse(ids[:4]) == (3, 0)  # the held context ends inside the first image: cut before its pads
    assert reuse(ids[:13]) == (11, 1)  # inside the second image
    assert reuse(ids, images=(first, random_image(2))) == (11, 1)  # the second image's pixels differ
    assert reuse(ids, images=(first, second.copy())) == (len(ids) - 1, 2)  # equal pixels, another object
    assert reuse((4,) + ids[1:]) == (0, 0)
