"""Chat messages with images/videos -> token ids and model inputs, for any Qwen2.5-VL tokenizer.

The chat template renders each image as one `<|vision_start|><|image_pad|><|vision_end|>`
(videos with `<|video_pad|>`); as in the Qwen processor, each single pad is then expanded to
the number of merged visual tokens of its grid (t * h * w / merge_size**2). Expansion works on
token ids, so it serves the tiny tokenizer and real checkpoints' tokenizers alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from pyvision_jax.processing.image import IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS, preprocess_images
from pyvision_jax.processing.tokens import num_visual_tokens
from pyvision_jax.processing.video import VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, VIDEO_TOTAL_PIXELS, preprocess_video


@dataclass(frozen=True)
class VisionTokenIds:
    """Ids of the Qwen2.5-VL vision tokens in a given tokenizer."""

    image_pad: int
    video_pad: int
    vision_start: int
    vision_end: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> VisionTokenIds:
        names = {
            "image_pad": "<|image_pad|>",
            "video_pad": "<|video_pad|>",
            "vision_start": "<|vision_start|>",
            "vision_end": "<|vision_end|>",
        }
        ids = {}
        for field, token in names.items():
            token_id = tokenizer.convert_tokens_to_ids(token)
            if (
                token_id is None
                or token_id == tokenizer.unk_token_id
                or (tokenizer.convert_ids_to_tokens(token_id) != token)
            ):
                raise ValueError(f"tokenizer {type(tokenizer).__name__} has no token {token}")
            ids[field] = int(token_id)
        return cls(**ids)


def expand_vision_pads(
    token_ids: Sequence[int],
    vision_ids: VisionTokenIds,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    merge_size: int = 2,
) -> list[int]:
    """Replaces the k-th single image (video) pad with the k-th grid's token count of pads."""
    grids = {vision_ids.image_pad: _grid_list(image_grid_thw), vision_ids.video_pad: _grid_list(video_grid_thw)}
    used = {pad: 0 for pad in grids}
    expanded: list[int] = []
    for token_id in token_ids:
        if token_id not in grids:
            expanded.append(int(token_id))
            continue
        index = used[token_id]
        if index >= len(grids[token_id]):
            raise ValueError(
                f"more {_pad_name(token_id, vision_ids)} placeholders in the text than the "
                f"{len(grids[token_id])} grids given"
            )
        expanded.extend([int(token_id)] * num_visual_tokens(grids[token_id][index], merge_size))
        used[token_id] = index + 1
    for pad, pad_grids in grids.items():
        if used[pad] != len(pad_grids):
            raise ValueError(
                f"{len(pad_grids)} grids given for {_pad_name(pad, vision_ids)} but the text has "
                f"{used[pad]} placeholders"
            )
    return expanded


def _grid_list(grid_thw: np.ndarray | None) -> list[np.ndarray]:
    if grid_thw is None:
        return []
    return list(np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3))


def _pad_name(token_id: int, vision_ids: VisionTokenIds) -> str:
    return "<|image_pad|>" if token_id == vision_ids.image_pad else "<|video_pad|>"


def encode_with_vision(
    tokenizer: Any,
    text: str,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    merge_size: int = 2,
) -> list[int]:
    """Token ids of text whose single image/video pads are expanded to their grids' sizes.

    For text fragments such as an observation turn holding `<|vision_start|><|image_pad|>
    <|vision_end|>` per produced image.
    """
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return expand_vision_pads(
        token_ids, VisionTokenIds.from_tokenizer(tokenizer), image_grid_thw, video_grid_thw, merge_size
    )


def render_chat(
    tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs: Any
) -> str:
    """The chat template's text (one pad per image/video)."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )


def encode_chat(
    tokenizer: Any,
    messages: list[dict],
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    add_generation_prompt: bool = True,
    merge_size: int = 2,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of a rendered chat with every image/video pad expanded to its grid."""
    text = render_chat(tokenizer, messages, add_generation_prompt, **template_kwargs)
    return encode_with_vision(tokenizer, text, image_grid_thw, video_grid_thw, merge_size)


def build_model_inputs(
    tokenizer: Any,
    messages: list[dict],
    images: Sequence[Image.Image | np.ndarray] = (),
    videos: Sequence[tuple[np.ndarray, float]] = (),
    add_generation_prompt: bool = True,
    image_min_pixels: int = IMAGE_MIN_PIXELS,
    image_max_pixels: int = IMAGE_MAX_PIXELS,
    video_min_pixels: int = VIDEO_MIN_PIXELS,
    video_max_pixels: int = VIDEO_MAX_PIXELS,
    video_total_pixels: int = VIDEO_TOTAL_PIXELS,
    patch_size: int = 14,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> dict[str, np.ndarray]:
    """What the Qwen2.5-VL processor returns for one conversation, as numpy arrays.

    images and videos are given in their order of appearance in messages; a video is
    (frames uint8 [T, H, W, 3], sample_fps). Keys: input_ids and attention_mask [1, L] int64,
    and when present pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
    second_per_grid_ts [n_videos] float32.
    """
    inputs: dict[str, np.ndarray] = {}
    if images:
        inputs["pixel_values"], inputs["image_grid_thw"] = preprocess_images(
            images, image_min_pixels, image_max_pixels, patch_size, merge_size, temporal_patch_size
        )
    if videos:
        processed = [
            preprocess_video(
                frames,
                sample_fps,
                video_min_pixels,
                video_max_pixels,
                video_total_pixels,
                patch_size,
                merge_size,
                temporal_patch_size,
            )
            for frames, sample_fps in videos
        ]
        inputs["pixel_values_videos"] = np.concatenate([v.pixel_values_videos for v in processed])
        inputs["video_grid_thw"] = np.concatenate([v.video_grid_thw for v in processed])
        inputs["second_per_grid_ts"] = np.asarray([v.second_per_grid_ts for v in processed], dtype=np.float32)
    token_ids = encode_chat(
        tokenizer,
        messages,
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        add_generation_prompt,
        merge_size,
    )
    inputs["input_ids"] = np.asarray([token_ids], dtype=np.int64)
    inputs["attention_mask"] = np.ones_like(inputs["input_ids"])
    return inputs
