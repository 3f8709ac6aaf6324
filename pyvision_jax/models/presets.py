"""Named Qwen2.5-VL sizes, as changes to `ModelConfig`'s defaults (the 7B's), so this module
needs no config class: `ModelConfig.preset(name)` applies them."""

from __future__ import annotations

from typing import Any


def _released(
    hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tie: bool, vision_inter: int = 3420
) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "tie_word_embeddings": tie,
        "vision": {"out_hidden_size": hidden, "intermediate_size": vision_inter},
    }


TINY: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "mrope_section": (2, 3, 3),
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 2000,
    "eos_token_id": 2002,
    "pad_token_id": 2000,
    "image_token_id": 2012,
    "video_token_id": 2013,
    "vision_start_token_id": 2009,
    "vision_end_token_id": 2010,
    "vision_token_id": 2011,
    "vision": {
        "depth": 4,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "fullatt_block_indexes": (1, 3),
        "window_size": 112,
        "tokens_per_second": 2,
    },
}
"""Random-weight test size; token ids match the tiny tokenizer (contracts.md)."""

SMALL: dict[str, Any] = {
    **TINY,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "mrope_section": (4, 6, 6),
    "vision": {**TINY["vision"], "out_hidden_size": 128},
}
"""The tiny tokenizer's ids with a decoder that learns the synthetic tasks on 2 CPU cores
(the shipped SFT checkpoint's size)."""

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": TINY,
    "small": SMALL,
    "3b": _released(2048, 11008, 36, 16, 2, 151936, True),
    "7b": _released(3584, 18944, 28, 28, 4, 152064, False),
    "32b": _released(5120, 27648, 64, 40, 8, 152064, False, vision_inter=3456),
    "72b": _released(8192, 29568, 80, 64, 8, 152064, False, vision_inter=3456),
}
