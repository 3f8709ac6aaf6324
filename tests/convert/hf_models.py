"""Tiny random Qwen2.5-VL checkpoints made by transformers itself (nothing is downloaded),
and tensor comparisons, shared by the conversion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

IMAGE_TOKEN, VISION_START, VISION_END = 2012, 2009, 2010


def tiny_hf_config(tie_word_embeddings: bool = False) -> Qwen2_5_VLConfig:
    text = dict(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=2000,
        eos_token_id=2002,
        pad_token_id=2000,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=48,
        num_heads=2,
        out_hidden_size=64,
        fullatt_block_indexes=[1],
        window_size=56,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        video_token_id=2013,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=tie_word_embeddings,
    )


def random_hf_model(tie_word_embeddings: bool = False, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    """fp32, eager attention, every parameter random (norm scales and biases too)."""
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration._from_config(
        tiny_hf_config(tie_word_embeddings), attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
    return model


def read_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of an HF directory (all shards), by stored name."""
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors |= load_file(file)
    return tensors


def assert_same_tensors(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        got = actual[name]
        assert (got.dtype, got.shape) == (value.dtype, value.shape), name
        assert got.tobytes() == value.tobytes(), name


def model_inputs(with_image: bool) -> dict[str, torch.Tensor]:
    """A two-sequence batch; with an image, 16 patches (grid 1x4x4) become 4 image tokens."""
    rng = np.random.default_rng(1)
    text = rng.integers(0, 2000, size=(2, 6))
    if not with_image:
        return {"input_ids": torch.tensor(text), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    image = [VISION_START] + [IMAGE_TOKEN] * 4 + [VISION_END]
    ids = np.concatenate([text[:, :3], np.tile(image, (2, 1)), text[:, 3:]], axis=1)
    return {
        "input_ids": torch.tensor(ids),
        "mm_token_type_ids": torch.tensor((ids == IMAGE_TOKEN).astype(np.int64)),
        "attention_mask": torch.ones(ids.shape, dtype=torch.long),
        "pixel_values": torch.tensor(rng.normal(size=(32, 3 * 2 * 14 * 14)), dtype=torch.float32),
        "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]]),
    }


def hf_logits(model: Qwen2_5_VLForConditionalGeneration, with_image: bool) -> torch.Tensor:
    with torch.no_grad():
        return model(**model_inputs(with_image)).logits
