"""The padded window layout: buckets, the inverse permutation, and no retrace within a bucket."""

import numpy as np

from pyvision_jax.models import forward, logits
from pyvision_jax.models.vision import bucket_size, vision_layout
from tests.models.model_configs import RAGGED
from tests.models.model_inputs import image_tokens, patches, right_padded, text


def test_bucket_sizes_are_few_and_cover_n():
    sizes = [bucket_size(n) for n in range(1, 200)]
    assert all(s >= n for n, s in zip(range(1, 200), sizes))
    assert sorted(set(sizes)) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def test_layout_places_every_patch_once_and_windows_respect_image_borders():
    grids = np.array([[1, 10, 14], [2, 4, 6]])  # an image and a 2-frame video
    layout = vision_layout(grids, RAGGED.vision)
    n_patches = int(np.prod(grids, -1).sum())
    valid = np.asarray(layout.slot_valid)
    assert sorted(np.asarray(layout.patch_index)[valid].tolist()) == list(range(n_patches))
    window_len = 3 * 3 * 4
    frames = np.asarray(layout.frame_id).reshape(-1, window_len)
    for window, ok in zip(frames, valid.reshape(-1, window_len)):
        assert len(set(window[ok].tolist())) <= 1  # a window never spans two frames/images
    assert len(set(np.asarray(layout.frame_id)[valid].tolist())) == 3
    # merged_index inverts the permutation: merged token j comes from patches 4j..4j+3
    n_merged = n_patches // 4
    unit_slot = np.asarray(layout.merged_index)[:n_merged]
    first_patch = np.asarray(layout.patch_index)[unit_slot * 4]
    np.testing.assert_array_equal(first_patch, np.arange(n_merged) * 4)


def test_new_image_sizes_within_a_bucket_do_not_retrace(tiny_reference):
    config, _, params, _ = tiny_reference

    def run(grid, seed):  # the shared shape of the parity tests, whose compilation this may reuse
        ids, mask = right_padded(text(3, seed) + image_tokens(grid))
        return logits(
            config,
            params,
            {
                "input_ids": ids,
                "attention_mask": mask,
                "pixel_values": patches(config, [grid], seed),
                "image_grid_thw": np.array([grid]),
            },
        )

    run((1, 10, 12), 1)  # 5x6 merged units: 4 windows, 30 merged tokens (bucket 32)
    before = forward._cache_size()
    out = run((1, 12, 10), 2)  # another image size in the same buckets
    assert forward._cache_size() == before  # no retrace within a bucket
    run((1, 8, 8), 3)  # 1 window, 16 merged tokens: a new bucket (compiled here or by an earlier test)
    assert np.isfinite(np.asarray(out)).all()
    assert forward._cache_size() in (before, before + 1)
