"""Video sampling, sizing and temporal patches (qwen-vl-utils rules, PIL resampling)."""

import imageio.v2 as imageio
import numpy as np
import pytest
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from pyvision_jax.processing.image import smart_resize
from pyvision_jax.processing.video import (
    VIDEO_MAX_PIXELS,
    VIDEO_MIN_PIXELS,
    frame_max_pixels,
    load_video_frames,
    preprocess_video,
    sample_frame_count,
    sample_frame_indices,
    video_frame_size,
)


@pytest.mark.parametrize(
    "total,video_fps,sample_fps,expected",
    [
        (300, 30.0, 2.0, 20),  # 10 s at 2 fps
        (300, 30.0, 1.0, 10),
        (301, 30.0, 1.0, 10),  # 10.03 frames floored to a multiple of 2
        (300, 30.0, 0.1, 4),  # at least min_frames
        (3, 30.0, 2.0, 2),  # never more than the video has, rounded down to 2
        (108000, 30.0, 2.0, 768),  # one hour: capped at max_frames
        (50, 25.0, 30.0, 50),  # more than the video's own rate: every frame
    ],
)
def test_sample_frame_count(total, video_fps, sample_fps, expected):
    assert sample_frame_count(total, video_fps, sample_fps) == expected


def test_sample_frame_count_rejects_single_frame_and_bad_fps():
    with pytest.raises(ValueError, match="at least 2 frames"):
        sample_frame_count(1, 30.0)
    with pytest.raises(ValueError, match="video_fps=0"):
        sample_frame_count(10, 0)


def test_sample_frame_indices_round_half_to_even_like_torch():
    np.testing.assert_array_equal(sample_frame_indices(10, 4), [0, 3, 6, 9])
    np.testing.assert_array_equal(sample_frame_indices(10, 5), [0, 2, 4, 7, 9])


def test_per_frame_budget_shrinks_with_frame_count():
    assert frame_max_pixels(4) == VIDEO_MAX_PIXELS
    assert frame_max_pixels(768) == pytest.approx(128000 * 28 * 28 * 0.9 / 768 * 2, rel=1e-6)
    assert frame_max_pixels(768, total_pixels=1000) == int(VIDEO_MIN_PIXELS * 1.05)
    assert frame_max_pixels(4, max_pixels=50_000) == 50_000
    assert video_frame_size(4, 1080, 1920) == (560, 1008)
    height, width = video_frame_size(768, 1080, 1920)
    assert height * width <= frame_max_pixels(768) and height % 28 == 0 and width % 28 == 0


def _frames(rng, count, height, width):
    return rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("count", [4, 5])
def test_video_patches_are_frame_pairs_of_the_image_processor(count):
    rng = np.random.default_rng(count)
    frames = _frames(rng, count, 90, 130)
    min_pixels, max_pixels = 3136, 40_000
    video = preprocess_video(frames, sample_fps=2.0, min_pixels=min_pixels, max_pixels=max_pixels)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    per_frame = [image_processor(frame, return_tensors="np") for frame in frames]
    t, h, w = video.video_grid_thw[0]
    assert (t, h, w) == (-(-count // 2), *per_frame[0]["image_grid_thw"][0, 1:])
    assert video.pixel_values_videos.shape == (t * h * w, 3 * 2 * 14 * 14)
    assert video.second_per_grid_ts == 1.0
    rows = video.pixel_values_videos.reshape(t, h * w, 3, 2, 14, 14)
    padded = list(range(count)) + [count - 1] * (count % 2)
    for index, frame_index in enumerate(padded):
        image_rows = per_frame[frame_index]["pixel_values"].reshape(h * w, 3, 2, 14, 14)[:, :, 0]
        np.testing.assert_array_equal(rows[index // 2, :, :, index % 2], image_rows)


def test_video_grid_follows_the_total_pixel_budget():
    frames = np.zeros((8, 360, 640, 3), dtype=np.uint8)
    # 8 frames under a total of 800,000 pixels: at most 800,000 / 8 * 2 = 200,000 per frame.
    video = preprocess_video(frames, sample_fps=1.0, total_pixels=800_000)
    assert video_frame_size(8, 360, 640, total_pixels=800_000) == (308, 588)
    np.testing.assert_array_equal(video.video_grid_thw, [[4, 308 // 14, 588 // 14]])
    # A tiny total budget is floored at 1.05 * min_pixels per frame.
    assert video_frame_size(8, 360, 640, total_pixels=1000) == smart_resize(
        360, 640, 28, VIDEO_MIN_PIXELS, int(VIDEO_MIN_PIXELS * 1.05)
    )
    assert video.second_per_grid_ts == 2.0


def test_bad_frames_are_named():
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        preprocess_video(np.zeros((2, 32, 32), dtype=np.uint8))
    with pytest.raises(ValueError, match="sample_fps"):
        preprocess_video(np.zeros((2, 32, 32, 3), dtype=np.uint8), sample_fps=0)


def test_load_video_frames_samples_uniformly(tmp_path):
    path = tmp_path / "clip.mp4"
    frames = np.zeros((40, 64, 96, 3), dtype=np.uint8)
    frames[:, :, :, 0] = np.arange(40, dtype=np.uint8)[:, None, None] * 6  # frame index in red
    imageio.mimwrite(path, frames, fps=10, codec="libx264", quality=10, macro_block_size=16)
    sampled, sample_fps = load_video_frames(path, sample_fps=2.0)
    assert sampled.shape == (8, 64, 96, 3)
    assert sample_fps == pytest.approx(2.0)
    expected = sample_frame_indices(40, 8) * 6
    np.testing.assert_allclose(sampled[:, 32, 48, 0], expected, atol=6)
    with pytest.raises(FileNotFoundError, match="missing.mp4"):
        load_video_frames(tmp_path / "missing.mp4")
