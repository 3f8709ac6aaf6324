"""Image/video preprocessing to patches, tokenizers and chat templates, visual-token counts.

Modules: image (smart resize, patchify; identical to transformers' Qwen2VLImageProcessorPil),
video (qwen-vl-utils frame sampling and budgets), tokens (visual token counts), chat
(placeholder expansion and model inputs for any Qwen2.5-VL tokenizer), tokenizer (the packaged
tiny tokenizer; scripts/build_tiny_tokenizer.py regenerates it).
"""

from pyvision_jax.processing.chat import (
    VisionTokenIds,
    build_model_inputs,
    encode_chat,
    encode_with_vision,
    expand_vision_pads,
    render_chat,
)
from pyvision_jax.processing.image import preprocess_image, preprocess_images, smart_resize
from pyvision_jax.processing.tokens import (
    image_token_count,
    num_visual_tokens,
    pil_image_token_count,
    video_token_count,
)
from pyvision_jax.processing.video import (
    VideoPatches,
    load_video_frames,
    preprocess_video,
    sample_frame_count,
    sample_frame_indices,
)

__all__ = [
    "VideoPatches",
    "VisionTokenIds",
    "build_model_inputs",
    "encode_chat",
    "encode_with_vision",
    "expand_vision_pads",
    "image_token_count",
    "load_video_frames",
    "num_visual_tokens",
    "pil_image_token_count",
    "preprocess_image",
    "preprocess_images",
    "preprocess_video",
    "render_chat",
    "sample_frame_count",
    "sample_frame_indices",
    "smart_resize",
    "video_token_count",
]
