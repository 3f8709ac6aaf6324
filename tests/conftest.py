"""Fixtures shared by every test directory."""

import pytest
from transformers import PreTrainedTokenizerFast

from pyvision_jax.processing.tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """The packaged tiny tokenizer, loaded once; tests only read it."""
    return load_tiny_tokenizer()
