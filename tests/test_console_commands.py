"""`pip install -e .` gives the five console commands; each answers --help with its own
flags, and each `launch/*.py` wrapper runs the same command. (absl's --help exits with
status 1 after printing the usage; argparse's with 0.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMMANDS = {
    "pyvision-train": ("launch/train.py", "--workdir"),
    "pyvision-eval": ("launch/eval.py", "--checkpoint"),
    "pyvision-convert": ("launch/convert.py", "hf2flax"),
    "pyvision-rollout-worker": ("launch/rollout_worker.py", "--worker-index"),
    "pyvision-make-tasks": ("launch/make_tasks.py", "--per-kind"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_console_command_answers_help(command):
    wrapper, flag = COMMANDS[command]
    for argv in ([str(BIN / command), "--help"], [sys.executable, str(ROOT / wrapper), "--help"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/")
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert flag in done.stdout + done.stderr, argv


def _one_line(argv, status=2):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == status and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


def test_bad_input_ends_each_command_with_one_line(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    line = _one_line([str(BIN / "pyvision-eval"), f"--data={missing}", f"--out={tmp_path / 'out'}"])
    assert line.startswith("pyvision-eval: error: ") and str(missing) in line
    line = _one_line(
        [
            str(BIN / "pyvision-eval"),
            f"--data={missing}",
            f"--out={tmp_path / 'out'}",
            f"--checkpoint={tmp_path / 'no_checkpoint'}",
        ]
    )
    assert "no_checkpoint" in line
    line = _one_line(
        [str(BIN / "pyvision-rollout-worker"), f"--workdir={tmp_path / 'fleet'}", "--config.rollout.engine=scripted"]
    )
    assert line.startswith("pyvision-rollout-worker: error: ") and "rollout.script_file" in line
    line = _one_line([str(BIN / "pyvision-make-tasks"), f"--out={tmp_path / 'tasks'}", "--seed=1", "--kinds=mazes"])
    assert line.startswith("pyvision-make-tasks: error: ") and "mazes" in line
    line = _one_line([str(BIN / "pyvision-convert"), "hf2flax", f"--src={tmp_path / 'none'}", f"--dst={tmp_path}"])
    assert "no such directory" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "tasks").exists()
