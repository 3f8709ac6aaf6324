"""ModelConfig: both HF layouts, presets, round trip through transformers, clear errors."""

import json

import pytest
from transformers import Qwen2_5_VLConfig

from pyvision_jax.models.config import ConfigError, ModelConfig


@pytest.mark.parametrize("name", ["tiny", "3b", "7b", "32b", "72b"])
def test_preset_round_trips_through_flat_and_transformers_nested_layouts(name):
    config = ModelConfig.preset(name)
    flat = config.to_hf_dict()
    assert "text_config" not in flat and flat["vision_config"]["depth"] == config.vision.depth
    assert ModelConfig.from_hf_dict(flat) == config
    nested = Qwen2_5_VLConfig(**flat).to_dict()
    assert "text_config" in nested
    assert ModelConfig.from_hf_dict(nested) == config


def test_released_7b_hub_config_parses():
    hub = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 128000,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": 152064,
        "vision_config": {
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    assert ModelConfig.from_hf_dict(hub) == ModelConfig.preset("7b")


def test_tiny_preset_uses_contract_token_ids():
    c = ModelConfig.preset("tiny")
    assert (c.vocab_size, c.image_token_id, c.video_token_id) == (2048, 2012, 2013)
    assert (c.vision_start_token_id, c.vision_end_token_id, c.eos_token_id, c.pad_token_id) == (2009, 2010, 2002, 2000)


def test_from_hf_dir_errors_name_file_and_field(tmp_path):
    flat = ModelConfig.preset("tiny").to_hf_dict()
    del flat["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(flat))
    with pytest.raises(ConfigError, match=r"config\.json.*'hidden_size'"):
        ModelConfig.from_hf_dir(tmp_path)
    flat = ModelConfig.preset("tiny").to_hf_dict()
    flat["rope_scaling"]["mrope_section"] = [1, 1, 1]
    (tmp_path / "config.json").write_text(json.dumps(flat))
    with pytest.raises(ConfigError, match="mrope_section"):
        ModelConfig.from_hf_dir(tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        ModelConfig.from_hf_dir(tmp_path / "missing")
    with pytest.raises(ConfigError, match="unknown model preset"):
        ModelConfig.preset("13b")
