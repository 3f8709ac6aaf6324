"""The converted tree is exactly the Flax model's parameter tree, and runs it."""

import jax
import numpy as np
import pytest

from pyvision_jax import models
from pyvision_jax.convert import load_hf
from pyvision_jax.convert.tree import flatten_params
from tests.convert.hf_models import hf_logits, model_inputs, random_hf_model


def _shapes(tree) -> dict:
    return {path: (tuple(leaf.shape), np.dtype(leaf.dtype)) for path, leaf in flatten_params(tree).items()}


@pytest.mark.parametrize("tie", [False, True])
def test_loaded_tree_matches_model_param_shapes(tie, tmp_path):
    random_hf_model(tie_word_embeddings=tie).save_pretrained(tmp_path / "hf")
    config, params = load_hf(tmp_path / "hf", progress=False)
    assert _shapes(params) == _shapes(models.param_shapes(config))


def test_loaded_params_reproduce_transformers_logits(hf_dir, hf_model):
    config, params = load_hf(hf_dir, progress=False)
    inputs = {k: v.numpy() for k, v in model_inputs(with_image=True).items() if k != "mm_token_type_ids"}
    got = np.asarray(jax.device_get(models.logits(config, params, inputs)))
    np.testing.assert_allclose(got, hf_logits(hf_model, with_image=True).numpy(), rtol=0, atol=1e-4)
