"""`launch/eval.py` without --checkpoint evaluates the config's own model: model.hf_dir (an HF
directory, or "packaged:NAME" under pyvision_jax/assets), else a random init of the preset."""

import jax
import numpy as np
import pytest

from configs.tiny_cpu import get_config
from pyvision_jax.convert import save_hf
from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.wiring.evaluation import config_policy


def test_without_hf_dir_the_policy_is_the_presets_random_init():
    config = get_config()
    config.model.preset, config.model.hf_dir = "tiny", ""
    policy = config_policy(config, progress=False)
    assert (policy.kind, policy.path, policy.version) == ("params", "preset:tiny", 0)
    assert policy.model_config == ModelConfig.preset("tiny")


def test_an_hf_dir_is_loaded_as_it_is(tmp_path):
    model = ModelConfig.preset("tiny")
    params = jax.tree.map(np.asarray, init_params(model, seed=3))
    save_hf(model, params, tmp_path / "hf", progress=False)
    config = get_config()
    config.model.hf_dir = str(tmp_path / "hf")
    policy = config_policy(config, progress=False)
    assert policy.kind == "hf" and policy.model_config == model
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(policy.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_missing_packaged_checkpoint_is_named_in_the_error():
    config = get_config()
    config.model.hf_dir = "packaged:no_such_checkpoint"
    with pytest.raises(
        FileNotFoundError,
        match=r"model.hf_dir='packaged:no_such_checkpoint': no packaged "
        r"checkpoint at .*assets/no_such_checkpoint",
    ):
        config_policy(config, progress=False)


def test_the_embedded_default_is_the_packaged_sft_checkpoint_of_the_small_preset():
    config = get_config()
    assert (config.model.preset, config.model.hf_dir) == ("small", "packaged:shapes_sft")
    policy = config_policy(config, progress=False)
    assert policy.kind == "hf" and policy.path.endswith("assets/shapes_sft")
    assert hf_config_dict(policy.model_config) == hf_config_dict(ModelConfig.preset("small"))
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(policy.params))
