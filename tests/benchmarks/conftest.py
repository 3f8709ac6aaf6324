"""The benchmark tests that need vLLM belong to the fleet environment (.venv-vllm), where
scripts/test.sh runs them (and fails if none is collected); an environment without vllm
leaves them out."""

import importlib.util

if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["test_engine_vs_vllm.py"]
