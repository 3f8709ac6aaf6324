"""ModelConfig: the presets, checks on construction naming the field, replace."""

import dataclasses

import pytest

from pyvision_jax.models.config import ModelConfig, ModelConfigError


def test_tiny_preset_uses_contract_token_ids():
    c = ModelConfig.preset("tiny")
    assert (c.vocab_size, c.image_token_id, c.video_token_id) == (2048, 2012, 2013)
    assert (c.vision_start_token_id, c.vision_end_token_id, c.eos_token_id, c.pad_token_id) == (2009, 2010, 2002, 2000)


def test_small_preset_is_tiny_with_a_wider_decoder():
    tiny, small = ModelConfig.preset("tiny"), ModelConfig.preset("small")
    assert (small.hidden_size, small.num_hidden_layers, small.mrope_section) == (128, 4, (4, 6, 6))
    assert small.vision == dataclasses.replace(tiny.vision, out_hidden_size=128)
    assert small.image_token_id == tiny.image_token_id


def test_released_presets_keep_defaults_outside_their_sizes():
    c = ModelConfig.preset("3b")
    assert (c.hidden_size, c.tie_word_embeddings, c.vocab_size) == (2048, True, 151936)
    assert c.vision.out_hidden_size == 2048 and c.vision.depth == ModelConfig().vision.depth
    assert ModelConfig.preset("7b") == ModelConfig()


def test_errors_name_the_field_and_the_preset():
    with pytest.raises(ModelConfigError, match="unknown model preset '13b'"):
        ModelConfig.preset("13b")
    with pytest.raises(ModelConfigError, match="'mrope_section'"):
        ModelConfig.preset("tiny").replace(mrope_section=(1, 1, 1))
