"""Logits parity with transformers' Qwen2_5_VLForConditionalGeneration (torch fp32, eager)."""

import numpy as np
import pytest

from pyvision_jax.models import logits, rope_index_for
from tests.models.hf_reference import hf_logits
from tests.models.model_inputs import image_tokens, patches, right_padded, text, video_tokens

TOL = 1e-4


def assert_parity(reference, inputs, position_ids=None):
    config, model, params, _ = reference
    expected = hf_logits(model, inputs, config, position_ids)
    if position_ids is not None:
        inputs = dict(inputs, position_ids=position_ids)
    got = np.asarray(logits(config, params, inputs))
    assert got.dtype == np.float32 and got.shape == expected.shape
    mask = np.asarray(inputs.get("attention_mask", np.ones(got.shape[:2]))).astype(bool)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(got[mask], expected[mask], atol=TOL, rtol=0)


def test_text_only(tiny_reference):
    assert_parity(tiny_reference, {"input_ids": np.array([text(11, 1), text(11, 2)])})


def test_tied_embeddings_text_only(tied_reference):
    assert "lm_head" not in tied_reference[2]
    assert_parity(tied_reference, {"input_ids": np.array([text(9, 3)])})


def test_one_image(tiny_reference):
    config = tiny_reference[0]
    grid = (1, 10, 12)  # 5x6 merged units: one full 4x4 window, three cut at the borders
    ids, mask = right_padded(text(3, 4) + image_tokens(grid) + text(5, 5))
    assert_parity(
        tiny_reference,
        {
            "input_ids": ids,
            "attention_mask": mask,
            "pixel_values": patches(config, [grid], 6),
            "image_grid_thw": np.array([grid]),
        },
    )


def test_two_images_of_different_sizes_in_one_sequence(tiny_reference):
    config = tiny_reference[0]
    grids = [(1, 10, 8), (1, 4, 12)]
    ids, mask = right_padded(text(2, 7) + image_tokens(grids[0]) + text(3, 8) + image_tokens(grids[1]) + text(4, 9))
    assert_parity(
        tiny_reference,
        {
            "input_ids": ids,
            "attention_mask": mask,
            "pixel_values": patches(config, grids, 10),
            "image_grid_thw": np.array(grids),
        },
    )


def test_left_padded_batch_with_images(tiny_reference):
    config = tiny_reference[0]
    grids = [(1, 4, 4), (1, 6, 4)]
    rows = [text(2, 11) + image_tokens(grids[0]) + text(3, 12), text(4, 13) + image_tokens(grids[1]) + text(6, 14)]
    width = 19  # the shape of the full forward in test_kv_cache
    ids = np.array([[config.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    assert mask[0].sum() < width
    assert_parity(
        tiny_reference,
        {
            "input_ids": ids,
            "attention_mask": mask,
            "pixel_values": patches(config, grids, 15),
            "image_grid_thw": np.array(grids),
        },
    )


def test_windows_ragged_at_image_borders(ragged_reference):
    config = ragged_reference[0]
    grids = [(1, 10, 14), (1, 8, 4)]  # 5x7 and 4x2 merged units against 3x3-unit windows
    ids = text(2, 16) + image_tokens(grids[0]) + text(2, 17) + image_tokens(grids[1]) + text(3, 18)
    assert_parity(
        ragged_reference,
        {"input_ids": np.array([ids]), "pixel_values": patches(config, grids, 19), "image_grid_thw": np.array(grids)},
    )


@pytest.mark.parametrize("seconds", [1.5, 1 / 3])
def test_video_with_our_position_ids(tiny_reference, seconds):
    """transformers' video rope rule differs from vLLM's, so it gets our position ids."""
    config = tiny_reference[0]
    video, image = (3, 4, 8), (1, 4, 4)
    ids, mask = right_padded(text(2, 20) + video_tokens(video) + text(2, 21) + image_tokens(image) + text(3, 22))
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "pixel_values_videos": patches(config, [video], 23),
        "video_grid_thw": np.array([video]),
        "second_per_grid_ts": np.array([seconds], np.float32),
        "pixel_values": patches(config, [image], 24),
        "image_grid_thw": np.array([image]),
    }
    positions, _ = rope_index_for(
        config, ids, mask, inputs["image_grid_thw"], inputs["video_grid_thw"], inputs["second_per_grid_ts"]
    )
    assert_parity(tiny_reference, inputs, position_ids=positions)
    # and logits() computes those same positions by itself
    config, model, params, _ = tiny_reference
    np.testing.assert_array_equal(
        np.asarray(logits(config, params, inputs)),
        np.asarray(logits(config, params, dict(inputs, position_ids=positions))),
    )
