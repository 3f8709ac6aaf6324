"""config.json: both HF layouts, round trip through transformers, clear errors naming file and field."""

import json

import pytest
from transformers import Qwen2_5_VLConfig

from pyvision_jax.convert.hf_config import hf_config_dict, load_model_config, model_config_from_hf
from pyvision_jax.models.config import ModelConfig, ModelConfigError


@pytest.mark.parametrize("name", ["tiny", "3b", "7b", "32b", "72b"])
def test_preset_round_trips_through_flat_and_transformers_nested_layouts(name):
    config = ModelConfig.preset(name)
    flat = hf_config_dict(config)
    assert "text_config" not in flat and flat["vision_config"]["depth"] == config.vision.depth
    assert model_config_from_hf(flat) == config
    nested = Qwen2_5_VLConfig(**flat).to_dict()
    assert "text_config" in nested
    assert model_config_from_hf(nested) == config


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
    assert model_config_from_hf(hub) == ModelConfig.preset("7b")


def test_load_model_config_errors_name_file_and_field(tmp_path):
    flat = hf_config_dict(ModelConfig.preset("tiny"))
    del flat["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(flat))
    with pytest.raises(ModelConfigError, match=r"config\.json.*'hidden_size'"):
        load_model_config(tmp_path)
    flat = hf_config_dict(ModelConfig.preset("tiny"))
    flat["rope_scaling"]["mrope_section"] = [1, 1, 1]
    (tmp_path / "config.json").write_text(json.dumps(flat))
    with pytest.raises(ModelConfigError, match="mrope_section"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json: not valid JSON"):
        load_model_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_model_config(tmp_path / "missing")
