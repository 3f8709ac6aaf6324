"""Held-out evaluation around training (eval/heldout.py): the seed guard, the switch, and
launch/train.py printing the accuracy before and after on the tiny model."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyvision_jax.wiring.heldout import train_with_heldout
from pyvision_jax.wiring.settings import heldout_config
from tests.eval.tiny_run import TINY
from tests.tiny_random_cpu import get_config
from tests.train.compilation_cache import COMPILATION_CACHE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("field", ["data.synthetic_seed", "sft.synthetic_seed"])
def test_a_heldout_seed_that_is_also_a_training_seed_is_refused(field):
    config = get_config()
    config.eval.heldout_per_kind = 1
    section, name = field.split(".")
    config.eval.heldout_seed = config[section][name]
    with pytest.raises(ValueError, match=re.escape(field)):
        heldout_config(config)


def test_heldout_evaluation_is_refused_in_a_multi_process_run():
    config = get_config()
    config.eval.heldout_per_kind, config.train.distributed = 1, True
    with pytest.raises(ValueError, match="single-process run"):
        heldout_config(config)


def test_without_heldout_tasks_only_the_training_runs(tmp_path):
    calls = []
    summary, results = train_with_heldout(
        get_config(), tmp_path, lambda c, w, progress: calls.append(w) or "done", progress=False
    )
    assert (summary, results, calls) == ("done", [], [tmp_path])
    assert not (tmp_path / "heldout").exists()


def test_launch_train_prints_heldout_accuracy_before_and_after(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        "--config",
        str(ROOT / "tests" / "tiny_random_cpu.py"),
        f"--workdir={tmp_path}",
        "--progress=false",
        *TINY,
        "--config.train.steps=1",
        "--config.eval.heldout_per_kind=1",
        "--config.eval.heldout_k=1",
        "--config.eval.max_new_tokens_per_turn=8",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    before = json.loads((tmp_path / "heldout" / "before" / "results.json").read_text())
    after = json.loads((tmp_path / "heldout" / "step_1" / "results.json").read_text())
    assert before["num_rollouts"] == after["num_rollouts"] == 3  # one task of each kind, k = 1
    assert before["run"]["checkpoint_kind"] != after["run"]["checkpoint_kind"]
    assert f"held-out before training: accuracy {before['accuracy']:.3f}" in result.stdout
    assert f"accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}" in result.stdout
    tasks = [json.loads(line) for line in (tmp_path / "heldout" / "tasks" / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["id"].split("-")[1] for t in tasks) == ["4242"] * 3
