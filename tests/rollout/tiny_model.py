"""The tiny random Qwen2.5-VL the engine tests run, and images and prompts for it."""

import jax
import numpy as np
from PIL import Image

from pyvision_jax.models import param_shapes


def random_params(config, seed):
    """Random float32 params drawn in numpy (no per-initializer compilation): unit norm
    scales, N(0, 0.05) elsewhere."""
    rng = np.random.default_rng(seed)

    def draw(path, shape):
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return np.ones(shape.shape, np.float32)
        return rng.normal(0.0, 0.05, shape.shape).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, param_shapes(config))


def text_ids(tokenizer, text):
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def random_image(seed, size=(56, 56)):
    """An RGB noise image of `size` (width, height): a 56 x 56 one is one grid (1, 4, 4),
    four merged image tokens."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def image_tokens(config, image):
    """The vision-start, image-pad and vision-end tokens of one image, and its grid."""
    grid = (1, image.size[1] // 14, image.size[0] // 14)
    pads = grid[1] * grid[2] // 4
    return ((config.vision_start_token_id,) + (config.image_token_id,) * pads + (config.vision_end_token_id,)), grid
