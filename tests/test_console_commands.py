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
