import pytest

from pyvision_jax.convert import names
from tests.convert.hf_models import tiny_hf_config


@pytest.fixture(scope="module")
def hf_config() -> dict:
    return tiny_hf_config().to_dict()


def test_paths_follow_the_contract():
    assert names.flax_slot("visual.blocks.1.attn.qkv.weight") == (("visual", "blocks", "attn", "qkv", "kernel"), 1)
    assert names.flax_slot("visual.merger.mlp.2.bias") == (("visual", "merger", "mlp", 2, "bias"), None)
    assert names.flax_path("visual.merger.mlp.2.bias") == ("visual", "merger", "mlp", 2, "bias")
    assert names.flax_path("visual.merger.ln_q.weight") == ("visual", "merger", "ln_q", "scale")
    assert names.flax_path("model.embed_tokens.weight") == ("model", "embed_tokens", "embedding")
    assert names.flax_slot("model.layers.5.input_layernorm.weight") == (
        ("model", "layers", "input_layernorm", "scale"),
        5,
    )
    assert names.flax_path("model.norm.weight") == ("model", "norm", "scale")
    assert names.flax_path("lm_head.weight") == ("lm_head", "kernel")
    assert names.flax_path("visual.patch_embed.proj.weight") == ("visual", "patch_embed", "proj", "kernel")


def test_v5_names_map_to_hub_paths():
    assert names.hub_name("model.visual.blocks.0.norm1.weight") == "visual.blocks.0.norm1.weight"
    assert names.hub_name("model.language_model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.up_proj.weight"
    assert names.hub_name("model.language_model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert names.hub_name("lm_head.weight") == "lm_head.weight"
    assert names.flax_path("model.language_model.norm.weight") == ("model", "norm", "scale")


def test_every_checkpoint_name_round_trips_through_its_slot(hf_config):
    shapes = names.checkpoint_shapes(hf_config)
    slots = {names.flax_slot(name) for name in shapes}
    assert len(slots) == len(shapes)
    for name in shapes:
        assert names.hf_name(*names.flax_slot(name)) == name


def test_param_leaves_stack_the_layers_in_order(hf_config):
    leaves = names.param_leaves(hf_config)
    q_proj = leaves[("model", "layers", "self_attn", "q_proj", "kernel")]
    text = {**hf_config, **hf_config.get("text_config", {})}
    layers, hidden = text["num_hidden_layers"], text["hidden_size"]
    assert q_proj.stacked and q_proj.shape == (layers, hidden, hidden)
    assert q_proj.tensors == tuple(f"model.layers.{i}.self_attn.q_proj.weight" for i in range(layers))
    qkv = leaves[("visual", "blocks", "attn", "qkv", "bias")]
    assert qkv.shape[0] == hf_config["vision_config"]["depth"]
    norm = leaves[("model", "norm", "scale")]
    assert not norm.stacked and norm.tensors == ("model.norm.weight",) and norm.shape == (hidden,)
    assert sum(len(spec.tensors) for spec in leaves.values()) == len(names.checkpoint_shapes(hf_config))


def test_layer_index_is_required_exactly_under_stacked_modules():
    with pytest.raises(ValueError, match="layer index"):
        names.hf_name(("model", "layers", "mlp", "up_proj", "kernel"))
    with pytest.raises(ValueError, match="layer index"):
        names.hf_name(("model", "norm", "scale"), 3)


def test_shapes_match_transformers_model(hf_model, hf_config):
    hub_state = {names.hub_name(k): tuple(v.shape) for k, v in hf_model.state_dict().items()}
    assert names.checkpoint_shapes(hf_config) == hub_state


def test_tied_config_has_no_lm_head():
    shapes = names.checkpoint_shapes(tiny_hf_config(tie_word_embeddings=True).to_dict())
    assert "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes


def test_flax_shapes_transpose_linear_and_flatten_conv():
    assert names.flax_shape("model.layers.0.mlp.up_proj.weight", (96, 64)) == (64, 96)
    assert names.flax_shape("visual.patch_embed.proj.weight", (32, 3, 2, 14, 14)) == (1176, 32)
    assert names.flax_shape("model.embed_tokens.weight", (2048, 64)) == (2048, 64)
    assert names.flax_shape("model.layers.0.self_attn.q_proj.bias", (64,)) == (64,)


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="running_mean"):
        names.flax_path("visual.blocks.0.norm1.running_mean")
    with pytest.raises(ValueError, match="weights"):
        names.hf_name(("model", "norm", "weights"))
