"""Fixtures: the tiny tokenizer and the synthetic benchmark of ``scripted_benchmark``."""

import pytest

from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
from tests.eval.scripted_benchmark import write_benchmark


@pytest.fixture(scope="session")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def benchmark(tmp_path_factory):
    return write_benchmark(tmp_path_factory.mktemp("bench"))
