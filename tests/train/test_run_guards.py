"""What the training command does with faults a user meets: a second trainer on a live
workdir, bad config values and input files (caught before any model is built, in one line
with status 2), a rerun with another model on a workdir, a full disk (one line, status 1),
damaged newest checkpoints (moved aside, redone, evaluation falls back with a note), and
SIGTERM during rollouts (abandoned, checkpoint saved, exit 0)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from pyvision_jax.convert.run_layout import QUARANTINE_DIR
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.workdir_lock import LOCK_FILE, WorkdirLock, WorkdirLockedError
from tests.train.test_launch import launch

ROOT = Path(__file__).resolve().parents[2]


def run_cli(workdir, *args, timeout=600):
    command, env = launch(workdir, *args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_error_line(done, status: int) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == status, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("pyvision-train: error: "), lines[0]
    return lines[0]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_second_trainer_on_a_live_workdir_is_refused_in_one_line(tmp_path):
    workdir = tmp_path / "run"
    command, env = launch(workdir, "--config.train.steps=1000")
    first = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: (workdir / LOCK_FILE).is_file() and (workdir / LOCK_FILE).read_text().strip(),
            300,
            "the first trainer's lock",
        )
        line = one_error_line(run_cli(workdir), 2)
        assert f"pid {first.pid}" in line and "in use by another trainer" in line and "host" in line
        assert first.poll() is None  # the first one runs on
    finally:
        first.kill()
        first.wait()


def test_a_lock_left_by_a_killed_trainer_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom pyvision_jax.train.workdir_lock import WorkdirLock\n"
                f"WorkdirLock({str(tmp_path)!r}).acquire()\nprint('held', flush=True)\ntime.sleep(600)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirLockedError, match=f"pid {holder.pid} on host"):
            WorkdirLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: no chance to release
        holder.wait()
    lock = WorkdirLock(tmp_path)
    lock.acquire()
    try:
        assert lock.previous["pid"] == holder.pid  # stale: its holder is gone
        again = WorkdirLock(tmp_path)
        again.acquire()  # reentrant within the process that holds it
        again.release()
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""


@pytest.mark.parametrize(
    "override, named",
    [
        ("--config.rl.group_size=0", "rl.group_size"),
        ("--config.train.lr=nan", "train.lr"),
        ("--config.episode.max_total_tokens=40", "episode.max_total_tokens"),
        ("--config.rollout.mode=streaming", "rollout.mode"),
    ],
)
def test_bad_config_values_stop_before_any_work_in_one_line(tmp_path, override, named):
    tasks = tmp_path / "tasks.jsonl"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(tmp_path / "red.png")
    tasks.write_text(
        json.dumps(
            {
                "id": "t0",
                "question": "What colour is the square?",
                "answer": "red",
                "data_source": "test",
                "image_path": "red.png",
            }
        )
        + "\n"
    )
    workdir = tmp_path / "run"
    done = run_cli(workdir, override, f"--config.data.train_files={tasks}", "--config.eval.heldout_per_kind=1")
    assert named in one_error_line(done, 2)
    assert not workdir.exists()  # nothing written: no held-out evaluation, no config.json


def test_bad_task_files_name_the_file_row_and_field(tmp_path):
    Image.new("RGB", (56, 56), (200, 30, 30)).save(tmp_path / "red.png")
    good = json.dumps(
        {"id": "t0", "question": "Which colour?", "answer": "red", "data_source": "test", "image_path": "red.png"}
    ).encode()
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(good + b"\n" + good.replace(b'"t0"', b'"t1"').replace(b"Which", b"Qu\xe9lle") + b"\n")
    line = one_error_line(run_cli(tmp_path / "run", f"--config.data.train_files={latin1}"), 2)
    assert str(latin1) in line and "row 2" in line and "'question'" in line and "UTF-8" in line
    missing = tmp_path / "missing.jsonl"
    missing.write_text(good.decode().replace("red.png", "blue.png") + "\n")
    line = one_error_line(run_cli(tmp_path / "run", f"--config.data.train_files={missing}"), 2)
    assert str(missing) in line and "row 1" in line and "image_path" in line
    assert not (tmp_path / "run").exists()


def test_a_rerun_with_another_model_is_refused_and_leaves_the_workdir_untouched(tmp_path):
    workdir = tmp_path / "run"
    done = run_cli(workdir, "--config.train.steps=1")
    assert done.returncode == 0, done.stderr[-3000:]
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in workdir.rglob("*") if "jax_cache" not in p.parts}
    line = one_error_line(run_cli(workdir, "--config.train.steps=2", "--config.model.preset=small"), 2)
    assert "model.preset='small'" in line and "'tiny'" in line and "another model" in line
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in workdir.rglob("*") if "jax_cache" not in p.parts}
    assert after == before


def test_a_full_disk_ends_the_command_with_one_line_naming_the_path_and_cause(tmp_path):
    disk = tmp_path / "small_disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        line = one_error_line(run_cli(disk / "run", "--config.train.steps=3"), 1)
        assert str(disk / "run") in line and ("No space left" in line or "ENOSPC" in line.upper()), line
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_damaged_newest_checkpoint_is_moved_aside_and_redone(tmp_path):
    workdir = tmp_path / "run"
    assert run_cli(workdir, "--config.train.steps=2").returncode == 0
    for path in (workdir / "checkpoints" / "2" / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
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
            f"--out={tmp_path / 'eval'}",
            "--k=1",
            "--config.eval.max_new_tokens_per_turn=8",
            "--progress=false",
        ],
        env=launch(workdir)[1],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    assert "checkpoint step 2 is unreadable" in evaluation.stderr and "evaluating step 1 instead" in evaluation.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["run"]["policy_version"] == 1 and len(results["run"]["skipped_checkpoints"]) == 1
    done = run_cli(workdir, "--config.train.steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "is unreadable" in line]
    assert len(warnings) == 1 and "moved to" in warnings[0] and "Traceback" not in done.stderr
    assert [p.name.split("-")[0] for p in (workdir / QUARANTINE_DIR).iterdir()] == ["2"]
    assert TrainCheckpoints(workdir / "checkpoints", 1, 3).all_steps() == [1, 2]  # step 2 saved afresh
    again = run_cli(workdir, "--config.train.steps=2")
    assert again.returncode == 0 and "is unreadable" not in again.stdout + again.stderr


def test_sigterm_during_rollouts_abandons_them_saves_and_exits(tmp_path):
    workdir = tmp_path / "run"
    command, env = launch(
        workdir, "--config.train.steps=1000", "--config.episode.max_new_tokens_per_turn=64", "--config.rl.group_size=4"
    )
    trainer = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: TrainCheckpoints(workdir / "checkpoints", 1, 3).latest_step(), 600, "a first checkpoint")
        trainer.send_signal(signal.SIGTERM)
        output, _ = trainer.communicate(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 0, output[-3000:]
    assert "rollouts in flight were abandoned" in output and "training interrupted at step" in output
    last = TrainCheckpoints(workdir / "checkpoints", 1, 3).latest_step()
    assert f"interrupted at step {last}" in output
