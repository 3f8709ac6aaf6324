"""Held-out evaluation around training (eval/heldout.py): the seed guard, the switch, and
launch/train.py printing the accuracy before and after on the tiny model."""

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.eval.constant_answer import best_constant_answer
from pyvision_jax.eval.heldout import HeldoutResult
from pyvision_jax.wiring import heldout
from pyvision_jax.wiring.heldout import heldout_tasks, train_with_heldout
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


def test_the_report_gives_plans_by_family_and_the_gain_over_the_best_constant_answer(tmp_path, monkeypatch):
    """On shapes tasks (all multiple-choice) the log and heldout/summary.json carry each
    family's plan shares and the after-training gain over the best constant answer, paired
    over the same tasks."""
    config = get_config()
    config.data.synthetic_kinds, config.eval.heldout_per_kind = ("shapes",), 4
    tasks = load_tasks(heldout_tasks(config, tmp_path), check_media=False).tasks
    constant = best_constant_answer(tasks)
    assert constant.accuracy == max(sum(t.answer == a for t in tasks) / len(tasks) for a in "ABCD")
    shares = {"shapes_easy": {"quick": 0.5, "careful": 0.5, "guess": 0.0, "other": 0.0}}
    evaluations = {
        "before": HeldoutResult(0.25, 1.0, tmp_path / "b", {t.id: 0.25 for t in tasks}, shares),
        "step_3": HeldoutResult(1.0, 1.5, tmp_path / "a", {t.id: 1.0 for t in tasks}, shares),
    }
    monkeypatch.setattr(heldout, "evaluate_heldout", lambda c, w, checkpoint, name, progress: evaluations[name])
    lines = []
    train = lambda c, w, progress: types.SimpleNamespace(interrupted=False, last_step=3)
    heldout.train_with_heldout(config, tmp_path, train, progress=False, log=lines.append)
    assert lines[1] == lines[3] == "  plans by family: shapes_easy quick 0.50, careful 0.50, guess 0.00, other 0.00"
    gain = 1.0 - constant.accuracy
    best = f"({constant.answer!r}, accuracy {constant.accuracy:.3f} on these tasks)"
    assert lines[4].startswith(f"  gain over the best constant answer {best}: {gain:+.3f} [")
    assert lines[4].endswith(f"] (95 % bootstrap over {len(tasks)} tasks)")
    report = json.loads((tmp_path / "heldout" / "summary.json").read_text())
    assert report["after_step_3"]["plans_by_family"] == shares and report["before"]["accuracy"] == 0.25
    assert report["best_constant_answer"]["answer"] == constant.answer
    difference = report["best_constant_answer"]["after_minus_constant"]
    assert difference["estimate"] == pytest.approx(gain)
    assert difference["ci95"][0] <= gain <= difference["ci95"][1] and difference["ci95"][0] < difference["ci95"][1]


def test_the_best_constant_answer_needs_multiple_choice_tasks_and_breaks_ties_alphabetically():
    def task(i, answer, answer_type="multiple_choice"):
        return Task(f"t{i}", "q", answer, answer_type, "s", image_path="x.png", options=("A", "B", "C", "D"))

    best = best_constant_answer([task(0, "B"), task(1, "C"), task(2, "C"), task(3, "B")])
    assert (best.answer, best.accuracy, best.per_task) == ("B", 0.5, {"t0": 1.0, "t1": 0.0, "t2": 0.0, "t3": 1.0})
    assert best_constant_answer([task(0, "B"), task(1, "3", "numeric")]) is None
    assert best_constant_answer([]) is None
