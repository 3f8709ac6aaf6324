"""Chat rendering with vision placeholders expanded as the Qwen2.5-VL processor does."""

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from pyvision_jax.processing.chat import (
    VisionTokenIds,
    build_model_inputs,
    encode_chat,
    encode_with_vision,
    expand_vision_pads,
    render_chat,
)
from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
from pyvision_jax.processing.video import preprocess_video

TINY = load_tiny_tokenizer()
TINY_IDS = VisionTokenIds(image_pad=2012, video_pad=2013, vision_start=2009, vision_end=2010)

MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "image"},
            {"type": "text", "text": "Compare with"},
            {"type": "image"},
            {"type": "text", "text": "and the video"},
            {"type": "video"},
        ],
    }
]


def _qwen_processor_ids(tokenizer, text, image_grids, video_grids, merge_size=2):
    """The rule of Qwen2_5_VLProcessor: the k-th pad string becomes n pad strings."""
    for grid in image_grids:
        text = text.replace("<|image_pad|>", "<|placeholder|>" * (int(np.prod(grid)) // merge_size**2), 1)
    text = text.replace("<|placeholder|>", "<|image_pad|>")
    for grid in video_grids:
        text = text.replace("<|video_pad|>", "<|placeholder|>" * (int(np.prod(grid)) // merge_size**2), 1)
    text = text.replace("<|placeholder|>", "<|video_pad|>")
    return tokenizer.encode(text, add_special_tokens=False)


def _other_tokenizer():
    """A byte-level tokenizer holding the Qwen tokens at other ids (as a real checkpoint does)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": [
                "<|vision_end|>",
                "<|video_pad|>",
                "<|image_pad|>",
                "<|vision_start|>",
                "<|im_start|>",
                "<|im_end|>",
            ]
        }
    )
    tokenizer.chat_template = TINY.chat_template
    return tokenizer


def test_vision_token_ids_are_looked_up():
    assert VisionTokenIds.from_tokenizer(TINY) == TINY_IDS
    other = VisionTokenIds.from_tokenizer(_other_tokenizer())
    assert (other.vision_end, other.video_pad, other.image_pad, other.vision_start) == (256, 257, 258, 259)
    bare = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "?": 1}, unk_token="?")), unk_token="?"
    )
    with pytest.raises(ValueError, match=r"no token <\|image_pad\|>"):
        VisionTokenIds.from_tokenizer(bare)


@pytest.mark.parametrize("tokenizer", [TINY, _other_tokenizer()], ids=["tiny", "other"])
def test_encode_chat_matches_the_qwen_processor_rule(tokenizer):
    image_grids = np.array([[1, 4, 6], [1, 10, 8]])
    video_grids = np.array([[3, 4, 4]])
    ids = encode_chat(tokenizer, MESSAGES, image_grids, video_grids)
    text = render_chat(tokenizer, MESSAGES)
    assert ids == _qwen_processor_ids(tokenizer, text, image_grids, video_grids)
    vision = VisionTokenIds.from_tokenizer(tokenizer)
    assert ids.count(vision.image_pad) == 6 + 20 and ids.count(vision.video_pad) == 12
    start = ids.index(vision.vision_start)
    assert ids[start + 1 : start + 7] == [vision.image_pad] * 6 and ids[start + 7] == vision.vision_end


def test_observation_fragment_with_two_images():
    text = (
        "<tool_response>\n<interpreter>\nText Result:\n3\nImage Result:\n"
        "<image_clue_1><|vision_start|><|image_pad|><|vision_end|></image_clue_1>"
        "<image_clue_2><|vision_start|><|image_pad|><|vision_end|></image_clue_2>"
        "</interpreter>\n\n</tool_response>"
    )
    ids = encode_with_vision(TINY, text, image_grid_thw=np.array([[1, 2, 2], [1, 4, 4]]))
    assert ids.count(2012) == 1 + 4
    assert TINY.decode(ids).replace("<|image_pad|>" * 4, "<|image_pad|>") == text


def test_placeholder_and_grid_counts_must_agree():
    with pytest.raises(ValueError, match=r"more <\|image_pad\|> placeholders .* than the 1 grids"):
        expand_vision_pads([2012, 5, 2012], TINY_IDS, image_grid_thw=np.array([[1, 2, 2]]))
    with pytest.raises(ValueError, match=r"2 grids given for <\|video_pad\|> but the text has 1"):
        expand_vision_pads([2013], TINY_IDS, video_grid_thw=np.array([[1, 2, 2], [1, 2, 2]]))


def test_build_model_inputs_matches_processor_outputs():
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(57, 91), (300, 200)]]
    frames = rng.integers(0, 256, (5, 64, 80, 3), dtype=np.uint8)
    inputs = build_model_inputs(TINY, MESSAGES, images=images, videos=[(frames, 0.5)], image_max_pixels=100_000)
    reference = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=100_000)(images, return_tensors="np")
    np.testing.assert_array_equal(inputs["pixel_values"], reference["pixel_values"])
    np.testing.assert_array_equal(inputs["image_grid_thw"], reference["image_grid_thw"])
    video = preprocess_video(frames, sample_fps=0.5)
    np.testing.assert_array_equal(inputs["pixel_values_videos"], video.pixel_values_videos)
    np.testing.assert_array_equal(inputs["video_grid_thw"], video.video_grid_thw)
    np.testing.assert_array_equal(inputs["second_per_grid_ts"], np.array([4.0], dtype=np.float32))
    expected_ids = _qwen_processor_ids(
        TINY, render_chat(TINY, MESSAGES), reference["image_grid_thw"], video.video_grid_thw
    )
    assert inputs["input_ids"].tolist() == [expected_ids]
    assert inputs["input_ids"].dtype == np.int64 and inputs["attention_mask"].shape == inputs["input_ids"].shape
    assert (inputs["attention_mask"] == 1).all()
