"""Fixtures of the conversion tests: a tiny random transformers model and its saved directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import Qwen2_5_VLForConditionalGeneration

from tests.convert.hf_models import random_hf_model


@pytest.fixture(scope="session")
def hf_model() -> Qwen2_5_VLForConditionalGeneration:
    return random_hf_model()


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, hf_model) -> Path:
    """save_pretrained output: one model.safetensors with Hub names, plus a side file."""
    path = tmp_path_factory.mktemp("hf") / "tiny"
    hf_model.save_pretrained(path)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    return path
