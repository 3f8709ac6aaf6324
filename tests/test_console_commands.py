"""`pip install -e .` gives the five console commands; every command (those, their
`launch/*.py` wrappers, `scripts/*.py` and the runnable `benchmarks`/`experiments` modules)
answers --help with its usage and status 0; user errors end a command with one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONSOLE_COMMANDS = re.findall(r'"(pyvision-[\w-]+) = ', (ROOT / "setup.py").read_text(encoding="utf-8"))
LAUNCH_FLAGS = {
    "train": "--workdir",
    "eval": "--checkpoint",
    "convert": "hf2flax",
    "rollout_worker": "--worker-index",
    "make_tasks": "--per-kind",
}
"""A flag of each command's own that its --help must list."""
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))
RUNNABLE_MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for folder in ("benchmarks", "experiments")
    for p in (ROOT / folder).rglob("*.py")
    if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
)
"""The benchmark and experiment modules a user runs (`python -m benchmarks.NAME`)."""


def help_commands() -> dict[str, tuple[list[str], str]]:
    """Each command's id -> (argv with --help, text its usage must hold)."""
    commands = {}
    for command in CONSOLE_COMMANDS:
        commands[command] = (
            [str(BIN / command), "--help"],
            LAUNCH_FLAGS[command.removeprefix("pyvision-").replace("-", "_")],
        )
    for path in sorted((ROOT / "launch").glob("*.py")):
        commands[f"launch/{path.name}"] = ([sys.executable, str(path), "--help"], LAUNCH_FLAGS[path.stem])
    for name in SCRIPTS:
        commands[f"scripts/{name}"] = ([sys.executable, str(ROOT / "scripts" / name), "--help"], "usage:")
    for module in RUNNABLE_MODULES:
        commands[module] = ([sys.executable, "-m", module, "--help"], "--")
    return commands


HELP_COMMANDS = help_commands()


def test_every_command_is_checked():
    assert len(CONSOLE_COMMANDS) == 5 and set(LAUNCH_FLAGS) == {p.stem for p in (ROOT / "launch").glob("*.py")}
    assert {"build_tiny_tokenizer.py", "check_install_matrix.py"} <= set(SCRIPTS)
    assert {"benchmarks.accelerator_suite", "experiments.reproduce_dynamics"} <= set(RUNNABLE_MODULES)


@pytest.mark.parametrize("command", sorted(HELP_COMMANDS))
def test_help_prints_the_usage_and_exits_zero(command):
    argv, expected = HELP_COMMANDS[command]
    cwd = ROOT if command in RUNNABLE_MODULES else "/"  # modules run from the repository root
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-2000:])
    assert expected in done.stdout, done.stdout[-2000:]


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
