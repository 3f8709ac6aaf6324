"""Incremental decoding with the KV cache equals the full forward pass."""

import jax
import numpy as np

from pyvision_jax.models import decode_step, logits, prefill, stack_layers, unstack_layers
from tests.models.model_inputs import image_tokens, patches, text


def test_token_by_token_decoding_matches_full_forward(tiny_reference):
    config, _, params, _ = tiny_reference
    grids = [(1, 4, 8), (1, 4, 4)]
    rows = [text(2, 30) + image_tokens(grids[0]) + text(2, 31), text(5, 32) + image_tokens(grids[1]) + text(3, 33)]
    width = max(map(len, rows))
    prompt = np.array([[config.pad_token_id] * (width - len(r)) + r for r in rows])
    prompt_mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    visual = {"pixel_values": patches(config, grids, 34), "image_grid_thw": np.array(grids)}
    generated = np.array([text(5, 35), text(5, 36)])

    full_ids = np.concatenate([prompt, generated], axis=1)
    full_mask = np.concatenate([prompt_mask, np.ones_like(generated)], axis=1)
    full = np.asarray(logits(config, params, {"input_ids": full_ids, "attention_mask": full_mask, **visual}))

    out, cache, deltas = prefill(
        config, params, {"input_ids": prompt, "attention_mask": prompt_mask, **visual}, max_length=width + 8
    )
    np.testing.assert_allclose(
        np.asarray(out)[prompt_mask.astype(bool)], full[:, :width][prompt_mask.astype(bool)], atol=1e-4, rtol=0
    )
    for step in range(generated.shape[1]):
        out, cache = decode_step(config, params, generated[:, step : step + 1], cache, deltas)
        np.testing.assert_allclose(np.asarray(out)[:, 0], full[:, width + step], atol=1e-4, rtol=0)
    assert int(cache.index) == width + generated.shape[1]


def test_decoding_with_the_layers_held_apart_gives_the_same_logits(tiny_reference):
    """The engine holds each decoder layer's weights apart (`unstack_layers`); a cached pass
    on them equals the cached pass on the stacked params, and stacking gives the params back."""
    config, _, params, _ = tiny_reference
    layered = unstack_layers(params)
    assert isinstance(layered["model"]["layers"], tuple) and len(layered["model"]["layers"]) == config.num_hidden_layers
    jax.tree.map(np.testing.assert_array_equal, stack_layers(layered), params)
    prompt = np.array([text(6, 40), text(6, 41)])
    generated = np.array([text(3, 42), text(3, 43)])
    runs = []
    for weights in (params, layered):
        out, cache, deltas = prefill(config, weights, {"input_ids": prompt}, max_length=12)
        steps = [np.asarray(out)]
        for step in range(generated.shape[1]):
            out, cache = decode_step(config, weights, generated[:, step : step + 1], cache, deltas)
            steps.append(np.asarray(out))
        runs.append(steps)
    for stacked_out, layered_out in zip(*runs):
        np.testing.assert_allclose(layered_out, stacked_out, atol=1e-6, rtol=0)
