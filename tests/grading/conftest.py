"""Fixtures for the grading tests: a stub OpenAI-compatible judge on 127.0.0.1."""

import importlib.util

import pytest

from tests.grading.stub_judge import running_stub

# The real-judge tests (`vllm serve`) belong to the fleet environment (.venv-vllm), where
# scripts/test.sh runs them; an environment without vllm leaves them out.
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["test_judge_vllm.py"]


@pytest.fixture
def server():
    with running_stub() as stub:
        yield stub
