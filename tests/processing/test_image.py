"""Image preprocessing is numerically identical to transformers' Qwen2VLImageProcessorPil."""

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference_smart_resize

from pyvision_jax.processing.image import patchify, preprocess_images, smart_resize


def _random_image(rng, height, width, mode="RGB"):
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def _reference(images, min_pixels, max_pixels):
    processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    out = processor(images, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.mark.parametrize(
    "height,width",
    [
        (1, 1),
        (27, 29),
        (28, 28),
        (57, 91),
        (300, 200),
        (1000, 1500),
        (3000, 4000),
        (10, 1999),
        (4000, 21),
        (123457, 1000),
        (56, 56 * 199),
    ],
)
@pytest.mark.parametrize("min_pixels,max_pixels", [(3136, 2_000_000), (256 * 28 * 28, 1280 * 28 * 28)])
def test_smart_resize_matches_reference(height, width, min_pixels, max_pixels):
    ours = smart_resize(height, width, 28, min_pixels, max_pixels)
    assert ours == reference_smart_resize(height, width, 28, min_pixels, max_pixels)
    assert ours[0] % 28 == 0 and ours[1] % 28 == 0


def test_smart_resize_rejects_extreme_aspect_ratio():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2001)
    with pytest.raises(ValueError, match="height=0"):
        smart_resize(0, 10)


@pytest.mark.parametrize("min_pixels,max_pixels", [(3136, 2_000_000), (3136, 50_000), (200_000, 400_000)])
def test_preprocess_images_is_bit_identical_to_transformers(min_pixels, max_pixels):
    rng = np.random.default_rng(min_pixels + max_pixels)
    images = [
        _random_image(rng, 57, 91),
        _random_image(rng, 300, 200),
        _random_image(rng, 613, 417),
        _random_image(rng, 28, 28),
        _random_image(rng, 12, 700),
        _random_image(rng, 77, 130, "RGBA"),
        _random_image(rng, 90, 45, "L"),
        _random_image(rng, 64, 64, "LA"),
    ]
    palette = _random_image(rng, 40, 50).convert("P")
    palette.info["transparency"] = 3
    images.append(palette)
    reference_values, reference_grid = _reference(images, min_pixels, max_pixels)
    pixel_values, grid_thw = preprocess_images(images, min_pixels, max_pixels)
    assert pixel_values.dtype == np.float32 and grid_thw.dtype == np.int64
    np.testing.assert_array_equal(grid_thw, reference_grid)
    np.testing.assert_array_equal(pixel_values, reference_values)


def test_uint8_arrays_match_pil_inputs():
    rng = np.random.default_rng(1)
    array = rng.integers(0, 256, (70, 110, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (70, 110), dtype=np.uint8)
    ours, grid = preprocess_images([array, gray])
    reference, reference_grid = _reference([Image.fromarray(array), Image.fromarray(gray)], 3136, 2_000_000)
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(grid, reference_grid)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="uint8"):
        preprocess_images([np.zeros((10, 10, 3), dtype=np.float32)])
    with pytest.raises(TypeError, match="str"):
        preprocess_images(["image.png"])
    with pytest.raises(ValueError, match="at least one"):
        preprocess_images([])


def test_patch_rows_hold_merge_windows_in_c_t_p_p_order():
    frames = np.arange(2 * 3 * 56 * 84, dtype=np.float32).reshape(2, 3, 56, 84)
    patches, grid = patchify(frames, patch_size=14, merge_size=2, temporal_patch_size=2)
    assert grid == (1, 4, 6) and patches.shape == (24, 3 * 2 * 14 * 14)
    # Row 3 is the second row, second column of the first 2x2 merge window: patch (1, 1).
    row = patches[3].reshape(3, 2, 14, 14)
    np.testing.assert_array_equal(row, frames[:, :, 14:28, 14:28].transpose(1, 0, 2, 3))
    # Row 4 starts the next merge window to the right: patch (0, 2).
    np.testing.assert_array_equal(patches[4].reshape(3, 2, 14, 14), frames[:, :, 0:14, 28:42].transpose(1, 0, 2, 3))
