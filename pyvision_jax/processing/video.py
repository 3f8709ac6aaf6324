"""Qwen2.5-VL video preprocessing: frame sampling, per-frame size budget, temporal patches.

Sampling and sizing follow qwen-vl-utils (the reference Qwen2.5-VL pipeline): the frame
count is the video's duration times the sampling fps, clamped to [min_frames, max_frames] and
floored to a multiple of 2; frame indices are `round(linspace(0, total - 1, n))`; each frame is
smart-resized under a per-frame budget of min(VIDEO_MAX_PIXELS, total_pixels / n * 2) (never
below 1.05 * min_pixels). `second_per_grid_ts` is temporal_patch_size / sample_fps with
sample_fps = n / total_frames * video_fps.

Frames are resized with PIL bicubic (as images are), not torchvision: the CPU environment
cannot load PyPI torchvision, and the PyVision recipe only feeds images, never videos, to the
model during training (video frames come back from the runtime as images).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from pyvision_jax.processing.image import patchify, rescale_and_normalize, resize_rgb, smart_resize

VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)
FRAME_FACTOR = 2
DEFAULT_SAMPLE_FPS = 2.0
MIN_FRAMES = 4
MAX_FRAMES = 768


class VideoPatches(NamedTuple):
    """Processor-key equivalents: pixel_values_videos, video_grid_thw, second_per_grid_ts."""

    pixel_values_videos: np.ndarray  # [t*h*w, 3*T*P*P] float32
    video_grid_thw: np.ndarray  # [1, 3] int64
    second_per_grid_ts: float


def sample_frame_count(
    total_frames: int,
    video_fps: float,
    sample_fps: float = DEFAULT_SAMPLE_FPS,
    min_frames: int = MIN_FRAMES,
    max_frames: int = MAX_FRAMES,
    frame_factor: int = FRAME_FACTOR,
) -> int:
    """How many frames uniform sampling at sample_fps takes (qwen-vl-utils' smart_nframes)."""
    if total_frames < frame_factor:
        raise ValueError(f"a video needs at least {frame_factor} frames, got {total_frames}")
    if video_fps <= 0 or sample_fps <= 0:
        raise ValueError(f"fps must be positive, got video_fps={video_fps} sample_fps={sample_fps}")
    lower = math.ceil(min_frames / frame_factor) * frame_factor
    upper = math.floor(min(max_frames, total_frames) / frame_factor) * frame_factor
    wanted = total_frames / video_fps * sample_fps
    count = math.floor(min(max(wanted, lower), upper, total_frames) / frame_factor) * frame_factor
    if not frame_factor <= count <= total_frames:
        raise ValueError(
            f"cannot sample {count} frames from a video of {total_frames} frames (frame_factor={frame_factor})"
        )
    return count


def sample_frame_indices(total_frames: int, num_frames: int) -> np.ndarray:
    """Uniform frame indices round(linspace(0, total - 1, n)) (half to even, as torch)."""
    return np.round(np.linspace(0, total_frames - 1, num_frames)).astype(np.int64)


def frame_max_pixels(
    num_frames: int,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
    total_pixels: int = VIDEO_TOTAL_PIXELS,
    frame_factor: int = FRAME_FACTOR,
) -> float:
    """The per-frame pixel budget given the video's total budget."""
    budget = max(min(VIDEO_MAX_PIXELS, total_pixels / num_frames * frame_factor), int(min_pixels * 1.05))
    return min(max_pixels, budget)


def video_frame_size(
    num_frames: int,
    height: int,
    width: int,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
    total_pixels: int = VIDEO_TOTAL_PIXELS,
    factor: int = 28,
) -> tuple[int, int]:
    """The resized (height, width) of every frame of a num_frames-frame clip."""
    return smart_resize(
        height,
        width,
        factor=factor,
        min_pixels=min_pixels,
        max_pixels=frame_max_pixels(num_frames, min_pixels, max_pixels, total_pixels),
    )


def preprocess_video(
    frames: np.ndarray,
    sample_fps: float = DEFAULT_SAMPLE_FPS,
    min_pixels: int = VIDEO_MIN_PIXELS,
    max_pixels: int = VIDEO_MAX_PIXELS,
    total_pixels: int = VIDEO_TOTAL_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> VideoPatches:
    """Sampled frames uint8 [T, H, W, 3] -> patches, grid [1, 3] and seconds per temporal patch.

    sample_fps is the rate the frames were sampled at (frames per second of video time). An odd
    T is padded by repeating the last frame.
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    if frames.shape[0] == 0:
        raise ValueError("a video needs at least one frame")
    if sample_fps <= 0:
        raise ValueError(f"sample_fps must be positive, got {sample_fps}")
    num_frames, height, width, _ = frames.shape
    resized_height, resized_width = video_frame_size(
        num_frames, height, width, min_pixels, max_pixels, total_pixels, factor=patch_size * merge_size
    )
    resized = np.stack([resize_rgb(Image.fromarray(frame), resized_height, resized_width) for frame in frames])
    if pad := -num_frames % temporal_patch_size:
        resized = np.concatenate([resized, np.repeat(resized[-1:], pad, axis=0)])
    patches, grid = patchify(rescale_and_normalize(resized), patch_size, merge_size, temporal_patch_size)
    return VideoPatches(patches, np.asarray([grid], dtype=np.int64), temporal_patch_size / sample_fps)


def load_video_frames(
    path: str | Path, sample_fps: float = DEFAULT_SAMPLE_FPS, min_frames: int = MIN_FRAMES, max_frames: int = MAX_FRAMES
) -> tuple[np.ndarray, float]:
    """Decodes uniformly sampled frames with decord: (frames uint8 [n, H, W, 3], sample_fps)."""
    import decord

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file not found: {path}")
    reader = decord.VideoReader(str(path))
    total_frames, video_fps = len(reader), float(reader.get_avg_fps())
    count = sample_frame_count(total_frames, video_fps, sample_fps, min_frames, max_frames)
    frames = reader.get_batch(sample_frame_indices(total_frames, count).tolist()).asnumpy()
    return frames, count / total_frames * video_fps
