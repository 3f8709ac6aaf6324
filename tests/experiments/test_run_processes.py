"""experiments.run_processes: commands a few at a time, each with its output in its own log, a
failure that stops no other, and SIGTERM to the parent stopping the running commands."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.run_processes import Command, run_commands

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120  # generous: on a loaded machine a python start can take seconds


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code))


def wait_for(path: Path, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(0.05)


def rendezvous(tmp_path: Path, me: str, other: str) -> tuple[str, ...]:
    """A command that announces itself, then exits 0 only if `other` runs at the same time."""
    return python(
        f"""
        import pathlib, sys, time
        here = pathlib.Path({str(tmp_path)!r})
        (here / {me!r}).touch()
        deadline = time.monotonic() + {WAIT_S}
        while not (here / {other!r}).exists():
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.05)
        print("met", {other!r})
        """
    )


def test_two_at_once_outcomes_in_order_and_output_in_each_log(tmp_path):
    fails = python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)")
    commands = [
        Command("a", rendezvous(tmp_path, "a", "b"), tmp_path / "logs" / "a.log"),
        Command("b", rendezvous(tmp_path, "b", "a"), tmp_path / "logs" / "b.log"),
        Command("c", fails, tmp_path / "c.log"),
        Command("d", python("print('after a failure')"), tmp_path / "d.log"),
    ]
    lines = []
    outcomes = run_commands(commands, parallel=2, log=lines.append)
    assert [(o.name, o.returncode) for o in outcomes] == [("a", 0), ("b", 0), ("c", 7), ("d", 0)]
    assert (tmp_path / "logs" / "a.log").read_text() == "met b\n"
    assert (tmp_path / "logs" / "b.log").read_text() == "met a\n"
    assert set((tmp_path / "c.log").read_text().split()) == {"out", "err"}
    assert (tmp_path / "d.log").read_text() == "after a failure\n"
    assert all(o.wall_time_s >= 0 for o in outcomes)
    assert any(line.startswith("c: FAILED (exit 7)") for line in lines)
    assert lines[-1].endswith("4 of 4 done, 0 running")


def test_never_more_than_parallel_at_once(tmp_path):
    """Each command counts the markers of the commands running beside it."""
    running = tmp_path / "running"
    running.mkdir()
    code = f"""
        import os, pathlib, time
        here = pathlib.Path({str(running)!r})
        me = here / str(os.getpid())
        me.touch()
        time.sleep(0.3)
        print(len(list(here.iterdir())))
        me.unlink()
        """
    commands = [Command(str(i), python(code), tmp_path / f"{i}.log") for i in range(5)]
    outcomes = run_commands(commands, parallel=2, log=lambda line: None)
    assert [o.returncode for o in outcomes] == [0] * 5
    counts = [int((tmp_path / f"{i}.log").read_text()) for i in range(5)]
    assert max(counts) <= 2


def test_each_command_gets_its_own_environment(tmp_path):
    show = python("import os; print(os.environ.get('RUN_NAME', 'unset'))")
    commands = [
        Command("x", show, tmp_path / "x.log", {**os.environ, "RUN_NAME": "x"}),
        Command("inherited", show, tmp_path / "inherited.log"),
    ]
    run_commands(commands, parallel=2, log=lambda line: None)
    assert (tmp_path / "x.log").read_text() == "x\n"
    assert (tmp_path / "inherited.log").read_text() == "unset\n"


@pytest.mark.parametrize(
    "parallel, names, message",
    [(0, ["a"], "parallel must be >= 1"), (1, ["a", "a"], "command names repeat")],
)
def test_refuses_bad_arguments(tmp_path, parallel, names, message):
    commands = [Command(name, python("pass"), tmp_path / f"{i}.log") for i, name in enumerate(names)]
    with pytest.raises(ValueError, match=message):
        run_commands(commands, parallel=parallel)


def test_sigterm_stops_the_running_commands_and_starts_no_more(tmp_path):
    """The parent gets SIGTERM while one command runs: that command gets SIGTERM (it records it
    and exits), the parent exits 143, and the waiting command never starts."""
    child = f"""
        import pathlib, signal, sys, time
        here = pathlib.Path({str(tmp_path)!r})
        def stop(signum, frame):
            (here / "child_terminated").touch()
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        (here / "child_started").touch()
        time.sleep({WAIT_S})
        """
    parent = f"""
        import sys
        from pathlib import Path
        from experiments.run_processes import Command, run_commands
        here = Path({str(tmp_path)!r})
        commands = [
            Command("long", (sys.executable, "-c", {textwrap.dedent(child)!r}), here / "long.log"),
            Command("never", (sys.executable, "-c", "open({str(tmp_path / "never_ran")!r}, 'w')"), here / "never.log"),
        ]
        run_commands(commands, parallel=1, grace_s=60)
        """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(python(parent), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(tmp_path / "child_started")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, output
    assert (tmp_path / "child_terminated").exists()
    assert "stopping 1 running command(s): ['long']" in output
    assert not (tmp_path / "never_ran").exists() and not (tmp_path / "never.log").exists()
