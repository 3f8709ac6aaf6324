"""Visual token counts of grids, images and uniformly sampled videos."""

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.processing.image import preprocess_images
from pyvision_jax.processing.tokens import (
    image_token_count,
    num_visual_tokens,
    pil_image_token_count,
    video_token_count,
)
from pyvision_jax.processing.video import preprocess_video, sample_frame_count, sample_frame_indices


def test_num_visual_tokens_of_one_and_several_grids():
    assert num_visual_tokens([1, 4, 6]) == 6
    assert num_visual_tokens(np.array([[1, 4, 6], [2, 10, 10]])) == 6 + 50
    assert num_visual_tokens([1, 4, 6], merge_size=1) == 24


@pytest.mark.parametrize("width,height", [(91, 57), (200, 300), (1500, 1000), (2100, 1300), (700, 12)])
def test_image_token_count_agrees_with_preprocessing(width, height):
    image = Image.new("RGB", (width, height))
    _, grid = preprocess_images([image], 3136, 2_000_000)
    assert image_token_count(width, height) == num_visual_tokens(grid)
    assert pil_image_token_count(image) == num_visual_tokens(grid)
    assert pil_image_token_count(image, max_pixels=50_000) <= 50_000 // 28**2


def test_image_token_count_at_the_design_budget():
    assert image_token_count(28, 28) == 4  # raised to min_pixels 3136 = 2 x 2 merged tokens
    assert image_token_count(3000, 3000) <= 2_000_000 // 28**2


def test_one_minute_1080p_video_at_1_fps():
    # 60 frames; per-frame budget 602,112 pixels -> 560 x 1008 -> grid (30, 40, 72).
    assert video_token_count(1800, 1920, 1080, fps=30.0, sample_fps=1.0) == 30 * 40 * 72 // 4


def test_video_token_count_agrees_with_preprocessing():
    rng = np.random.default_rng(0)
    total, fps = 47, 10.0
    video = rng.integers(0, 256, (total, 60, 100, 3), dtype=np.uint8)
    count = sample_frame_count(total, fps, 2.0)
    frames = video[sample_frame_indices(total, count)]
    patches = preprocess_video(frames, sample_fps=count / total * fps)
    assert video_token_count(total, 100, 60, fps, sample_fps=2.0) == num_visual_tokens(patches.video_grid_thw)
