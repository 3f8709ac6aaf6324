"""Qwen2.5-VL image preprocessing: smart resize, rescale, normalize, patchify.

Numerically identical to transformers' `Qwen2VLImageProcessorPil` (the processor vLLM and the
Hub checkpoints use without torchvision): RGB conversion compositing transparency onto white,
PIL bicubic resize to the smart-resized size, rescale by 1/255 in float64 then float32,
CLIP normalisation in float32, and the same patch order (merge windows contiguous, each row
laid out as C, T, P, P with the image repeated temporal_patch_size times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESCALE_FACTOR = 1 / 255
MAX_ASPECT_RATIO = 200

# The PyVision recipe's image budget (docs/design.md).
IMAGE_MIN_PIXELS = 3136
IMAGE_MAX_PIXELS = 2_000_000


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = IMAGE_MIN_PIXELS, max_pixels: int = IMAGE_MAX_PIXELS
) -> tuple[int, int]:
    """Qwen's target size: both sides multiples of factor, area within [min, max] pixels.

    Rounds each side to the nearest multiple, then rescales (keeping the aspect ratio) by
    flooring when the area exceeds max_pixels or ceiling when it is below min_pixels.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got height={height} width={width}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {ratio} "
            f"(height={height}, width={width})"
        )
    resized_height = round(height / factor) * factor
    resized_width = round(width / factor) * factor
    if resized_height * resized_width > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_height = max(factor, math.floor(height / beta / factor) * factor)
        resized_width = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_height * resized_width < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_height = math.ceil(height * beta / factor) * factor
        resized_width = math.ceil(width * beta / factor) * factor
    return resized_height, resized_width


def to_rgb(image: Image.Image | np.ndarray) -> Image.Image:
    """An RGB PIL image; transparency is composited onto white (as transformers does).

    Arrays must be uint8 [H, W, 3] (RGB) or [H, W] (grayscale).
    """
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[-1] == 3)):
            raise ValueError(f"image arrays must be uint8 [H, W, 3] or [H, W], got {image.dtype} {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL image or a uint8 array, got {type(image).__name__}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def resize_rgb(image: Image.Image, height: int, width: int) -> np.ndarray:
    """PIL bicubic resize of an RGB image to (height, width); uint8 [H, W, 3]."""
    return np.asarray(image.resize((width, height), resample=Image.Resampling.BICUBIC))


def rescale_and_normalize(pixels: np.ndarray) -> np.ndarray:
    """uint8 [..., H, W, 3] -> float32 [..., 3, H, W], rescaled to [0, 1] and CLIP-normalised."""
    rescaled = (pixels.astype(np.float64) * RESCALE_FACTOR).astype(np.float32)
    mean = np.asarray(CLIP_MEAN, dtype=np.float32)
    std = np.asarray(CLIP_STD, dtype=np.float32)
    return np.moveaxis((rescaled - mean) / std, -1, -3)


def patchify(
    frames: np.ndarray, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Flattens frames [T, C, H, W] (T a multiple of temporal_patch_size) to patch rows.

    Returns (patches [t*h*w, C*T*P*P], (t, h, w)) with rows ordered by temporal index, then
    merge window (row-major), then position inside the window: the order the merger expects.
    """
    num_frames, channels, height, width = frames.shape
    factor = patch_size * merge_size
    if num_frames % temporal_patch_size or height % factor or width % factor:
        raise ValueError(
            f"frames of shape {frames.shape} cannot be patchified: T must be a multiple of "
            f"{temporal_patch_size}, H and W multiples of {factor}"
        )
    grid_t = num_frames // temporal_patch_size
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = frames.reshape(
        grid_t,
        temporal_patch_size,
        channels,
        grid_h // merge_size,
        merge_size,
        patch_size,
        grid_w // merge_size,
        merge_size,
        patch_size,
    )
    # -> (t, h_block, w_block, h_in, w_in, C, T, P, P)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    return np.ascontiguousarray(flat, dtype=np.float32), (grid_t, grid_h, grid_w)


def preprocess_image(
    image: Image.Image | np.ndarray,
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (pixel_values [h*w, 3*T*P*P] float32, (1, h, w))."""
    rgb = to_rgb(image)
    height, width = smart_resize(
        rgb.height, rgb.width, factor=patch_size * merge_size, min_pixels=min_pixels, max_pixels=max_pixels
    )
    normalized = rescale_and_normalize(resize_rgb(rgb, height, width))
    frames = np.broadcast_to(normalized[None], (temporal_patch_size, *normalized.shape))
    return patchify(frames, patch_size, merge_size, temporal_patch_size)


def preprocess_images(
    images: Sequence[Image.Image | np.ndarray],
    min_pixels: int = IMAGE_MIN_PIXELS,
    max_pixels: int = IMAGE_MAX_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """Images -> (pixel_values [sum of patches, 3*T*P*P] float32, grid_thw [n, 3] int64).

    The processor-key equivalents are `pixel_values` and `image_grid_thw`.
    """
    if len(images) == 0:
        raise ValueError("preprocess_images needs at least one image")
    patches, grids = [], []
    for image in images:
        image_patches, grid = preprocess_image(
            image, min_pixels, max_pixels, patch_size, merge_size, temporal_patch_size
        )
        patches.append(image_patches)
        grids.append(grid)
    return np.concatenate(patches, axis=0), np.asarray(grids, dtype=np.int64)
