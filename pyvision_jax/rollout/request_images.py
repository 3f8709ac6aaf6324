"""The images of a generation request: checked against its grids and pad tokens, and turned
into the patches the vision tower reads."""

from __future__ import annotations

import numpy as np

from pyvision_jax.agent.engine import GenerationRequest
from pyvision_jax.models import ModelConfig
from pyvision_jax.processing.image import preprocess_images


def check_images(config: ModelConfig, request: GenerationRequest) -> None:
    """Raises (naming the request) unless the image-pad tokens match the grids and every image
    has its grid's size."""
    vision = config.vision
    grids = request.image_grid_thw
    pads = sum(1 for t in request.prompt_token_ids if t == config.image_token_id)
    expected = int(np.sum(np.prod(grids, axis=-1))) // vision.spatial_merge_size**2
    if pads != expected:
        raise ValueError(
            f"request {request.request_id}: {pads} image-pad tokens in the "
            f"prompt but image_grid_thw accounts for {expected}"
        )
    for k, (image, (_, h, w)) in enumerate(zip(request.images, grids)):
        size = (int(w) * vision.patch_size, int(h) * vision.patch_size)
        if image.size != size:
            raise ValueError(
                f"request {request.request_id}: image {k} is {image.size[0]}x"
                f"{image.size[1]} but its grid {list(map(int, grids[k]))} "
                f"needs {size[0]}x{size[1]} (images come resized)"
            )


def image_patches(config: ModelConfig, request: GenerationRequest, first: int = 0) -> np.ndarray | None:
    """Patches of the request's images from image `first` on (None when there are none); each
    image is already at its grid's size, so preprocessing only normalises and patchifies."""
    vision = config.vision
    images, grids = request.images[first:], request.image_grid_thw[first:]
    if not images:
        return None
    pixels = [im.size[0] * im.size[1] for im in images]
    patches, got = preprocess_images(
        images,
        min_pixels=min(pixels),
        max_pixels=max(pixels),
        patch_size=vision.patch_size,
        merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    )
    if not np.array_equal(got, grids):
        raise ValueError(
            f"request {request.request_id}: preprocessing gave grids {got.tolist()}, the request says {grids.tolist()}"
        )
    return patches
