"""How many LLM tokens images and videos cost (t * h * w / merge_size**2 per grid)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from pyvision_jax.processing.image import IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS, smart_resize
from pyvision_jax.processing.video import (
    MAX_FRAMES,
    MIN_FRAMES,
    VIDEO_MAX_PIXELS,
    VIDEO_MIN_PIXELS,
    VIDEO_TOTAL_PIXELS,
    sample_frame_count,
    video_frame_size,
)


def num_visual_tokens(grid_thw: np.ndarray | list, merge_size: int = 2) -> int:
    """Tokens of one grid [3] or the total of several grids [n, 3]."""
    grids = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    return int(np.sum(np.prod(grids, axis=1) // (merge_size * merge_size)))


def image_token_count(
    width: int,
    height: int,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
) -> int:
    """Tokens of a width x height image after smart resize."""
    resized_height, resized_width = smart_resize(
        height, width, factor=patch_size * merge_size, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return resized_height * resized_width // (patch_size * merge_size) ** 2


def pil_image_token_count(
    image: Image.Image,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
) -> int:
    """Tokens of a PIL image after smart resize."""
    return image_token_count(image.width, image.height, min_pixels, max_pixels, patch_size, merge_size)


def video_token_count(
    num_frames: int,
    width: int,
    height: int,
    fps: float,
    sample_fps: float = 1.0,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
    total_pixels: int = VIDEO_TOTAL_PIXELS,
    min_frames: int = MIN_FRAMES,
    max_frames: int = MAX_FRAMES,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> int:
    """Tokens of a video (num_frames at fps) fed whole by uniform sampling at sample_fps.

    This is the cost the PyVision paper compares on-demand context construction against.
    """
    sampled = sample_frame_count(num_frames, fps, sample_fps, min_frames, max_frames, frame_factor=temporal_patch_size)
    resized_height, resized_width = video_frame_size(
        sampled, height, width, min_pixels, max_pixels, total_pixels, factor=patch_size * merge_size
    )
    grid = (-(-sampled // temporal_patch_size), resized_height // patch_size, resized_width // patch_size)
    return num_visual_tokens(grid, merge_size)
