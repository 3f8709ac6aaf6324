"""What a held cache row holds for an episode between its turns, and how much of a new
request's prompt it can serve.

A row is held when its request ends: its valid columns are the KV of ``HeldContext.token_ids``
(the prompt and the generated tokens but the last, which was never fed). The episode's next
request repeats that context and appends to it (the last token, the tool response with its
images, the next prompt), so only the suffix needs a prefill. ``reusable_prefix`` says how long
the shared prefix is: the longest common token prefix, at most all but the prompt's last token
(whose logits the first new token needs), cut back to the start of any image it would split
or whose pixels differ from the held row's image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from pyvision_jax.agent.engine import GenerationRequest


@dataclass(frozen=True)
class HeldContext:
    """The context whose KV a held row keeps, and when the row was last used (LRU clock)."""

    request_id: str
    token_ids: np.ndarray
    images: tuple[Image.Image, ...]
    image_grid_thw: np.ndarray
    used: int


def same_image(a: Image.Image, b: Image.Image) -> bool:
    """The same pixels (the episode passes the same objects; anything else is compared)."""
    return a is b or (a.size == b.size and a.mode == b.mode and a.tobytes() == b.tobytes())


def reusable_prefix(
    held: HeldContext, request: GenerationRequest, image_token_id: int, merge_size: int
) -> tuple[int, int]:
    """(tokens, images) at the start of the request's prompt whose KV the held row has."""
    prompt = np.asarray(request.prompt_token_ids)
    shared = min(len(held.token_ids), len(prompt) - 1)
    differ = np.flatnonzero(held.token_ids[:shared] != prompt[:shared])
    length = int(differ[0]) if differ.size else shared
    pads = np.flatnonzero(prompt == image_token_id)
    sizes = np.prod(request.image_grid_thw, axis=-1) // merge_size**2
    ends = np.cumsum(sizes)  # pad tokens up to the end of each image
    inside = int(np.searchsorted(pads, length))  # pad tokens before the cut
    images = int(np.searchsorted(ends, inside, side="right"))  # images wholly before it
    for k in range(images):
        kept = k < len(held.images) and np.array_equal(held.image_grid_thw[k], request.image_grid_thw[k])
        if not (kept and same_image(held.images[k], request.images[k])):
            images = k
            break
    first_pad = int(ends[images] - sizes[images]) if images < len(sizes) else inside
    if first_pad < inside:  # an image the cut splits, or one that differs, starts the suffix
        length = int(pads[first_pad])
    return length, images
