"""A damaged newest checkpoint, many times over: the trainer's and the evaluation's fallback to
the previous step print one warning and no traceback in every run, whether its data files
were deleted or truncated. Each restore runs in a fresh process (orbax's reads still in flight
after the failure report to a closed event loop by thread timing, so one clean run proves
little), first without any command's hooks, then through `pyvision-train` and `pyvision-eval`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_launch import launch

ROOT = Path(__file__).resolve().parents[2]
RUNS = 4  # per damage and fallback


def damage(workdir: Path, how: str) -> None:
    """Deletes the newest checkpoint's array data files, or truncates every file of its state."""
    state = workdir / "checkpoints" / "2" / "state"
    files = [path for path in state.rglob("*") if path.is_file()]
    for path in files:
        if how == "deleted" and path.parent.name == "d":
            path.unlink()
        elif how == "truncated":
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def child(mode: str, workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.train.damaged_checkpoint", mode, str(workdir)],
        cwd=ROOT,
        env=launch(workdir)[1],
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_warning(done: subprocess.CompletedProcess, run: str, quiet: bool = True) -> None:
    """One warning naming the step; with `quiet`, no traceback either (the commands' promise; a bare
    restore in a child process can still print orbax's background tracebacks under load)."""
    output = done.stdout + done.stderr
    warnings = [line for line in output.splitlines() if "is unreadable" in line]
    assert done.returncode == 0, f"{run}: {done.stderr[-3000:]}"
    if quiet:
        assert "Traceback" not in output and "Event loop is closed" not in output, f"{run}: {output[-3000:]}"
    assert len(warnings) == 1 and "checkpoint step 2" in warnings[0], f"{run}: {warnings}"
    assert "tensorstore_spec" not in warnings[0], warnings[0]  # the cause, not orbax's specs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("saved") / "run"
    made = child("make", workdir)
    assert made.returncode == 0, made.stderr[-3000:]
    return workdir


@pytest.mark.parametrize("how", ["deleted", "truncated"])
@pytest.mark.parametrize("mode", ["restore", "policy"])
def test_each_fallback_warns_once_in_every_run(saved, tmp_path, how, mode):
    for run in range(RUNS):
        workdir = tmp_path / f"run{run}"
        shutil.copytree(saved, workdir)
        damage(workdir, how)
        done = child(mode, workdir)
        assert_one_warning(done, f"run {run}", quiet=False)
        assert "restored 1" in done.stdout


def test_the_commands_fall_back_with_one_warning_in_every_run(tmp_path):
    base = tmp_path / "base"
    command, env = launch(base, "--config.train.steps=2")
    trained = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert trained.returncode == 0, trained.stderr[-3000:]
    for run, how in enumerate(["deleted", "truncated", "deleted"]):
        workdir = tmp_path / f"run{run}"
        shutil.copytree(base, workdir)
        damage(workdir, how)
        evaluation = subprocess.run(
            [
                sys.executable,
                str(ROOT / "launch" / "eval.py"),
                "--config",
                str(ROOT / "tests" / "tiny_random_cpu.py"),
                "--config.model.hf_dir=",
                "--config.model.preset=tiny",
                f"--checkpoint={workdir}",
                f"--data={workdir / 'tasks' / 'counting.jsonl'}",
                f"--out={tmp_path / f'eval{run}'}",
                "--k=1",
                "--config.eval.max_new_tokens_per_turn=8",
                "--progress=false",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert_one_warning(evaluation, f"pyvision-eval, run {run} ({how})")
        command, env = launch(workdir, "--config.train.steps=2")
        resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert_one_warning(resumed, f"pyvision-train, run {run} ({how})")
