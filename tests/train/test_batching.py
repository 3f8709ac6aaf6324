"""Host batching matches the model's own processor-input path (positions, patches, layout)."""

import io

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.models import prepare_inputs
from pyvision_jax.processing.image import preprocess_images
from pyvision_jax.train.batching import BatchingConfig, choose_length, pack_batch, pack_rows


def test_one_micro_batch_equals_prepare_inputs(tiny_config, trajectories):
    batch, stats = pack_batch(tiny_config, trajectories, [1.0, 2.0, 3.0, 4.0], BatchingConfig((64, 128), 4))
    images = [Image.open(io.BytesIO(im.png)) for t in trajectories for im in t.images]
    pixels, grids = preprocess_images(images, min_pixels=56 * 56, max_pixels=56 * 56)
    reference, _ = prepare_inputs(
        tiny_config,
        {
            "input_ids": batch.input_ids[0],
            "attention_mask": batch.attention_mask[0],
            "pixel_values": pixels,
            "image_grid_thw": grids,
        },
    )
    np.testing.assert_array_equal(batch.positions[0], reference.positions)
    np.testing.assert_array_equal(batch.pixel_values[0], reference.pixel_values)
    for name in ("patch_index", "slot_valid", "positions", "frame_id", "merged_index"):
        np.testing.assert_array_equal(getattr(batch.layout, name)[0], getattr(reference.layout, name))
    lengths = [len(t.token_ids) for t in trajectories]
    assert stats.real_tokens == sum(lengths) == int(batch.attention_mask.sum())
    for row, t in enumerate(trajectories):
        np.testing.assert_array_equal(batch.input_ids[0, row, : lengths[row]], t.token_ids)
        assert batch.loss_mask[0, row].sum() == t.loss_mask.sum() and batch.advantages[0, row] == row + 1


def test_micro_batches_share_vision_shapes_and_padding_rows_carry_no_loss(tiny_config, trajectories):
    rows = trajectories[:3] + [None]
    batch, stats = pack_batch(tiny_config, rows, [1.0, 1.0, 1.0, 5.0], BatchingConfig((64,), 2))
    assert batch.input_ids.shape == (2, 2, 64) and batch.pixel_values.shape[0] == 2
    assert not batch.attention_mask[1, 1].any() and not batch.loss_mask[1, 1].any()
    assert batch.advantages[1, 1] == 0.0 and stats.real_rows == 3


def test_images_per_row_gives_batches_of_fewer_images_the_shape_of_the_fullest(tiny_config, trajectories):
    one_each, two_each = [trajectories[0], trajectories[2]], [trajectories[1], trajectories[3]]
    assert [len(t.images) for t in one_each + two_each] == [1, 1, 2, 2]
    free = BatchingConfig((64, 128), 2)
    held = BatchingConfig((64, 128), 2, images_per_row=2, image_max_pixels=56 * 56)
    shape = lambda rows, config: pack_batch(tiny_config, rows, [1.0, 1.0], config)[1].shape  # noqa: E731
    assert shape(one_each, free) != shape(two_each, free)
    assert shape(one_each, held) == shape(two_each, held) == shape(two_each, free)
    with pytest.raises(ValueError, match="train.images_per_row"):
        BatchingConfig((64,), 2, images_per_row=-1)


def test_too_long_trajectory_names_the_config_field():
    with pytest.raises(ValueError, match="train.length_buckets"):
        choose_length([70], (32, 64))
    assert choose_length([33], (32, 64)) == 64


def test_first_fit_decreasing_fills_rows_up_to_capacity():
    rows = pack_rows([50, 30, 20, 60, 10, 40], 64)
    assert sorted(i for row in rows for i in row) == list(range(6))
    lengths = [50, 30, 20, 60, 10, 40]
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    assert rows == [[3], [0, 4], [5, 2], [1]]


def test_packed_rows_hold_each_trajectory_as_a_segment_with_its_own_positions(tiny_config, trajectories):
    advantages = [1.0, 2.0, 3.0, 4.0]
    plain, _ = pack_batch(tiny_config, trajectories, advantages, BatchingConfig((128,), 4))
    packed, stats = pack_batch(tiny_config, trajectories, advantages, BatchingConfig((128,), 2, pack=True))
    lengths = [len(t.token_ids) for t in trajectories]
    assert packed.input_ids.shape == (1, 2, 128) and packed.segment_ids.shape == (1, 2, 128)
    assert packed.advantages.shape == (1, 2, 3)  # the first row holds three segments
    assert stats.real_rows == 4 and stats.real_tokens == sum(lengths) == int(packed.attention_mask.sum())
    found = []
    for row in range(2):
        segments = packed.segment_ids[0, row]
        for k in range(1, segments.max() + 1):
            span = np.flatnonzero(segments == k)
            (t,) = [
                i
                for i, n in enumerate(lengths)
                if n == len(span) and np.array_equal(trajectories[i].token_ids, packed.input_ids[0, row, span])
            ]
            found.append(t)
            assert span[0] == 0 or segments[span[0] - 1] == k - 1
            np.testing.assert_array_equal(packed.positions[0][:, row, span], plain.positions[0, :, t, : len(span)])
            np.testing.assert_array_equal(packed.loss_mask[0, row, span], trajectories[t].loss_mask.astype(bool))
            assert packed.advantages[0, row, k - 1] == advantages[t]
    assert sorted(found) == [0, 1, 2, 3]
    assert not packed.attention_mask[0][packed.segment_ids[0] == 0].any()
    assert packed.pixel_values.shape[1] == plain.pixel_values.shape[1]
