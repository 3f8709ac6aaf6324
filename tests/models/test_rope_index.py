"""Host-side 3-D M-RoPE positions: hand-worked videos, transformers for images, decode deltas."""

import numpy as np
import pytest
import torch

from pyvision_jax.models import decode_position_ids, rope_index
from tests.models.hf_reference import mm_token_types

IMAGE, VIDEO, V_START, V_END = 2012, 2013, 2009, 2010
IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=2)


def test_video_text_continues_at_max_position_plus_one():
    # t=3 frames of 2x2 merged units, 1.5 s per temporal grid, 2 tokens per second:
    # temporal index k * 1.5 * 2 = 0, 3, 6 (+3 start). Text after continues at 9 + 1.
    ids = np.array([[7, 8, V_START] + [VIDEO] * 12 + [V_END, 9]])
    pos, deltas = rope_index(ids, video_grid_thw=[[3, 4, 4]], second_per_grid_ts=[1.5], tokens_per_second=2, **IDS)
    t = [0, 1, 2] + [3] * 4 + [6] * 4 + [9] * 4 + [10, 11]
    h = [0, 1, 2] + [3, 3, 4, 4] * 3 + [10, 11]
    w = [0, 1, 2] + [3, 4, 3, 4] * 3 + [10, 11]
    np.testing.assert_array_equal(pos[:, 0], np.array([t, h, w]))
    assert deltas.tolist() == [12 - 17]


def test_video_temporal_index_truncates_like_the_reference():
    # 1/3 s per grid at 2 tokens/s: k * 0.6667 -> 0, 0, 1, 2; a 1x2-unit frame.
    ids = np.array([[V_START] + [VIDEO] * 8 + [V_END]])
    pos, deltas = rope_index(ids, video_grid_thw=[[4, 2, 4]], second_per_grid_ts=[1 / 3], tokens_per_second=2, **IDS)
    np.testing.assert_array_equal(pos[0, 0], [0] + [1, 1, 1, 1, 2, 2, 3, 3] + [4])
    np.testing.assert_array_equal(pos[2, 0], [0] + [1, 2] * 4 + [4])
    assert deltas.tolist() == [5 - 10]


def test_tall_video_frame_text_continues_after_largest_spatial_index():
    # one temporal grid (t=1) of 3x1 merged units: max over h is start+2, so text resumes at +3.
    ids = np.array([[5, V_START] + [VIDEO] * 3 + [V_END]])
    pos, _ = rope_index(ids, video_grid_thw=[[1, 6, 2]], second_per_grid_ts=[2.0], tokens_per_second=2, **IDS)
    np.testing.assert_array_equal(pos[:, 0], [[0, 1, 2, 2, 2, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2, 2, 2, 5]])


def test_images_match_transformers_on_a_padded_batch(tiny_reference):
    config, model, _, _ = tiny_reference
    rows = [
        [1, 2, V_START] + [IMAGE] * 6 + [V_END, 3],
        [4, V_START] + [IMAGE] * 4 + [V_END, 5, V_START] + [IMAGE] * 2 + [V_END, 6],
    ]
    width = max(map(len, rows))
    ids = np.array([[0] * (width - len(r)) + r for r in rows])
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    grids = np.array([[1, 4, 6], [1, 4, 4], [1, 2, 4]])
    pos, deltas = rope_index(ids, mask, image_grid_thw=grids, **IDS)
    ref_pos, ref_deltas = model.model.get_rope_index(
        torch.as_tensor(ids),
        torch.as_tensor(mm_token_types(ids, config)),
        image_grid_thw=torch.as_tensor(grids),
        attention_mask=torch.as_tensor(mask),
    )
    real = mask.astype(bool)
    np.testing.assert_array_equal(pos[:, real], ref_pos.numpy()[:, real])
    np.testing.assert_array_equal(deltas, ref_deltas.numpy().reshape(-1))


def test_decode_positions_follow_the_deltas():
    ids = np.array([[0, 5, V_START] + [IMAGE] * 4 + [V_END]])
    mask = np.array([[0, 1, 1, 1, 1, 1, 1, 1]])
    pos, deltas = rope_index(ids, mask, image_grid_thw=[[1, 4, 4]], **IDS)
    assert pos[:, 0, 1:].max() == 4 and deltas.tolist() == [5 - 7]
    np.testing.assert_array_equal(decode_position_ids(deltas, mask.sum(-1), 2)[:, 0], [[5, 6]] * 3)


def test_mismatched_placeholders_are_reported():
    ids = np.array([[V_START] + [IMAGE] * 3 + [V_END]])
    with pytest.raises(ValueError, match="needs 4 consecutive"):
        rope_index(ids, image_grid_thw=[[1, 4, 4]], **IDS)
    with pytest.raises(ValueError, match="no placeholder tokens"):
        rope_index(np.array([[1, 2]]), image_grid_thw=[[1, 4, 4]], **IDS)
    with pytest.raises(ValueError, match="more <\\|video_pad\\|> tokens"):
        rope_index(np.array([[VIDEO] * 4]), **IDS)
