"""Fixtures shared by every test directory."""

import pytest
from transformers import PreTrainedTokenizerFast

from pyvision_jax.processing.tokenizer import load_tiny_tokenizer

# The test files that take minutes, longest first (measured on 2 cores). scripts/test.sh's
# pytest-xdist workers take whole files in collection order (--no-loadscope-reorder), so these
# start first rather than leave one worker running them alone at the end; the order of
# everything else is unchanged.
LONGEST_FILES = (
    "tests/test_doc_commands.py",
    "tests/benchmarks/test_fleet_soak.py",
    "tests/train/test_damaged_checkpoints.py",
    "tests/train/test_multihost.py",
    "tests/experiments/test_ablations.py",
    "tests/train/test_validation_kill.py",
    "tests/train/test_sft_runs.py",
    "tests/benchmarks/test_accelerator_suite.py",
    "tests/train/test_run_guards.py",
    "tests/train/test_secrets_stay_out.py",
    "tests/train/test_trainer_kill.py",
    "tests/benchmarks/test_main_job_time.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """The packaged tiny tokenizer, loaded once; tests only read it."""
    return load_tiny_tokenizer()
