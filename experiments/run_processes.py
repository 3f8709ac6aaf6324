"""Commands run a few at a time, each in a process of its own with its output in a log file.

The dynamics ablations train independent runs (one per variant and seed) that can share a
machine. Each run is a whole command, so a crash, a hang or a signal in one run touches no
other, and what a run finished stays on disk for a rerun.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

# how long a stopped run may take to save its checkpoint after SIGTERM before it is killed
TERMINATE_GRACE_S = 120.0
POLL_S = 1.0


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: its name in progress lines, its argv, the file its output goes to and its
    environment (None: this process's)."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    env: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit code (negative: the signal that killed it) and wall time."""

    name: str
    returncode: int
    wall_time_s: float
    log_path: Path


class _SigtermFlag:
    """Set by SIGTERM; the scheduling loop exits at its next turn, so a signal never falls
    between starting a command and recording it."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = signum


def _stop(running: dict[str, tuple[subprocess.Popen, float, Command]], grace_s: float) -> None:
    """SIGTERM to every running command (a trainer saves its checkpoint and exits), then SIGKILL
    to those still running after `grace_s`."""
    for process, _, _ in running.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process, _, _ in running.values():
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_commands(
    commands: Sequence[Command],
    parallel: int,
    log: Callable[[str], None] = print,
    cwd: str | None = None,
    grace_s: float = TERMINATE_GRACE_S,
) -> list[Outcome]:
    """Runs `commands`, at most `parallel` at once, in their order; returns their outcomes in
    that order. A failed command does not stop the others. On KeyboardInterrupt or SIGTERM the
    running commands get SIGTERM (then SIGKILL after `grace_s`) before the exception goes on
    (SIGTERM as SystemExit(143)); commands not yet started never start."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    names = [c.name for c in commands]
    if len(set(names)) != len(names):
        raise ValueError(f"command names repeat: {names}")
    pending = list(commands)
    running: dict[str, tuple[subprocess.Popen, float, Command]] = {}
    outcomes: dict[str, Outcome] = {}
    sigterm = _SigtermFlag()
    previous = signal.signal(signal.SIGTERM, sigterm)
    try:
        while pending or running:
            if sigterm.signum is not None:
                raise SystemExit(128 + sigterm.signum)
            while pending and len(running) < parallel:
                command = pending.pop(0)
                command.log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(command.log_path, "ab") as out:
                    process = subprocess.Popen(
                        command.argv,
                        cwd=cwd,
                        env=None if command.env is None else dict(command.env),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                running[command.name] = (process, time.monotonic(), command)
                log(f"{command.name}: started (output: {command.log_path})")
            time.sleep(POLL_S)
            for name, (process, begin, command) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                outcome = Outcome(name, process.returncode, round(time.monotonic() - begin, 1), command.log_path)
                outcomes[name] = outcome
                state = "finished" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
                log(
                    f"{name}: {state} in {outcome.wall_time_s:.0f} s; {len(outcomes)} of {len(commands)} done, "
                    f"{len(running)} running"
                )
        if sigterm.signum is not None:  # it came while the last commands ended
            raise SystemExit(128 + sigterm.signum)
    except (KeyboardInterrupt, SystemExit):
        log(f"stopping {len(running)} running command(s): {sorted(running)}")
        _stop(running, grace_s)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return [outcomes[name] for name in names]
