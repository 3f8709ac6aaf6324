"""Fixtures: the synthetic benchmark of ``scripted_benchmark``."""

import pytest

from tests.eval.scripted_benchmark import write_benchmark


@pytest.fixture(scope="session")
def benchmark(tmp_path_factory):
    return write_benchmark(tmp_path_factory.mktemp("bench"))
