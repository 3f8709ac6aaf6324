"""rollout.engine="vllm" in the main .venv (no vllm package): a clear error naming the vLLM
environment, from evaluation and from the rollout worker launcher, before any model loads."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pyvision_jax.eval.policy import LoadedPolicy
from pyvision_jax.models import ModelConfig
from pyvision_jax.wiring.evaluation import build_engine
from tests.tiny_random_cpu import get_config

ROOT = Path(__file__).resolve().parents[2]
NAMES_THE_ENVIRONMENT = r"\.venv-vllm.*scripts/install_fleet\.sh"


def test_this_suite_runs_without_vllm():
    assert importlib.util.find_spec("vllm") is None


def test_eval_engine_names_the_vllm_environment(tmp_path):
    config = get_config()
    config.rollout.engine = "vllm"
    policy = LoadedPolicy(
        kind="hf",
        path=str(tmp_path),
        model_config=ModelConfig.preset("tiny"),
        params=None,
        version=0,
        tokenizer_dir=None,
    )
    with pytest.raises(RuntimeError, match=NAMES_THE_ENVIRONMENT):
        build_engine(config, policy, None, work_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_rollout_worker_names_the_vllm_environment(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "launch" / "rollout_worker.py"),
            "--config.rollout.engine=vllm",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode != 0
    assert ".venv-vllm" in done.stderr and "scripts/install_fleet.sh" in done.stderr
    assert list(tmp_path.iterdir()) == []
