"""Errors a user causes (a bad file, field or value; a workdir in use) and errors of the
machine (a full disk) end a command with one line on stderr naming the cause, no traceback:
status 2 for bad input, 1 for a failed write. Anything else is a bug and keeps its traceback.

Input errors are caught only around the checks that run before any work (config sections
and input files: `wiring.validation`), so a ValueError raised by a bug later is never
mistaken for one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

from pyvision_jax.convert.orbax_reports import drop_stray_orbax_reports
from pyvision_jax.rollout.intake import SpoolWriteError
from pyvision_jax.rollout.queue import QueueAccessError
from pyvision_jax.rollout.worker import CursorWriteError
from pyvision_jax.run_logs.metrics import MetricsWriteError
from pyvision_jax.run_logs.run_outputs import OutputWriteError
from pyvision_jax.train.checkpoint import CheckpointWriteError, NoIntactCheckpointError
from pyvision_jax.train.workdir_lock import WorkdirLockedError

INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, UnicodeError, KeyError)
"""What the pre-run checks raise for bad input (files that are missing, unreadable or malformed;
config values out of range)."""
RUN_ERRORS: tuple[type[BaseException], ...] = (
    CheckpointWriteError,
    MetricsWriteError,
    OutputWriteError,
    SpoolWriteError,
    CursorWriteError,
    NoIntactCheckpointError,
)
"""Writes that failed (disk full, read-only) and a workdir with no readable checkpoint."""
BAD_INPUT_STATUS, FAILED_WRITE_STATUS = 2, 1


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    if isinstance(error, KeyError) and error.args:
        text = f"missing key {error.args[0]!r}"
    return text.splitlines()[0] if text else type(error).__name__


def _not_orbax(record: logging.LogRecord) -> bool:
    return f"{os.sep}orbax{os.sep}" not in record.pathname


def quiet_background_reports() -> None:
    """Orbax logs each failed background save or restore with its traceback, and every
    failure it logs also reaches the run as an exception (`CheckpointWriteError` on the next
    wait, a fallback in `restore_intact`), reported there in one line: its logs are dropped.
    Python's warning that JAX is multithreaded when the sandbox starts a subprocess
    (fork + exec, which is safe) is dropped too, and so are the reports of orbax's other reads
    and writes after one failed (`drop_stray_orbax_reports`)."""
    drop_stray_orbax_reports()
    logging.getLogger("absl").addFilter(_not_orbax)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_orbax)
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)


class CommandExit(SystemExit):
    """The command ends with this status after its one line; `exits_at_once` ends the
    process once every `finally` of the command has run."""


def _exit(program: str, error: BaseException, status: int) -> None:
    print(f"{program}: error: {first_line(error)}", file=sys.stderr, flush=True)
    raise CommandExit(status) from None


@contextlib.contextmanager
def exits_at_once() -> Iterator[None]:
    """Around a whole command: after a `CommandExit` (whose command has closed what it
    opened) the process ends at once, so background threads of a failed run (asynchronous
    checkpoint or event writers) cannot turn the one line into interpreter-shutdown noise."""
    quiet_background_reports()
    try:
        yield
    except CommandExit as done:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(done.code))


@contextlib.contextmanager
def bad_input_exits(program: str) -> Iterator[None]:
    """Around the pre-run checks: bad input ends the command with one line, status 2."""
    try:
        yield
    except INPUT_ERRORS as error:
        _exit(program, error, BAD_INPUT_STATUS)


@contextlib.contextmanager
def failed_writes_exit(program: str) -> Iterator[None]:
    """Around the run: a workdir in use (status 2), a failed write or no readable checkpoint
    (status 1) ends the command with one line."""
    try:
        yield
    except (WorkdirLockedError, QueueAccessError) as error:
        _exit(program, error, BAD_INPUT_STATUS)
    except RUN_ERRORS as error:
        _exit(program, error, FAILED_WRITE_STATUS)
