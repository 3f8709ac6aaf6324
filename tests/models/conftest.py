"""Shared fixtures: random tiny transformers models (built once per session) and their params."""

import pytest

from tests.models.hf_reference import build_hf_model, hf_dir_to_params
from tests.models.model_configs import RAGGED, TIED, TINY


def _reference(tmp_path_factory, config, name):
    hf_dir = tmp_path_factory.mktemp(name)
    model = build_hf_model(config, hf_dir)
    return config, model, hf_dir_to_params(hf_dir, config), hf_dir


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory):
    """(config, torch model, flax params, hf_dir) for the tiny preset."""
    return _reference(tmp_path_factory, TINY, "tiny")


@pytest.fixture(scope="session")
def ragged_reference(tmp_path_factory):
    return _reference(tmp_path_factory, RAGGED, "ragged")


@pytest.fixture(scope="session")
def tied_reference(tmp_path_factory):
    return _reference(tmp_path_factory, TIED, "tied")
