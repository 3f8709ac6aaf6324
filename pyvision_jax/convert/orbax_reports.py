"""Orbax's failures reported in one line: the stray reports its asynchronous reads and
writes leave after a failure dropped, its logging quieted around a restore that may fail, and
an error's first line without the tensorstore specs orbax appends. Shared by the trainer's
checkpoints, the evaluation's checkpoint loading and the commands' error handling."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator


def _is_closed_loop_report(unraisable: sys.UnraisableHookArgs) -> bool:
    error = unraisable.exc_value
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _not_an_orbax_task_report(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if not message.startswith(("Task exception was never retrieved", "Future exception was never retrieved")):
        return True
    # the task's coroutine is orbax's own, or asyncio's `_wrap_awaitable` around a tensorstore read
    # of a damaged checkpoint, whose error names the tensorstore driver
    orbax_task = f"{os.sep}orbax{os.sep}" in message
    tensorstore_read = "OCDBT" in message or "tensorstore" in message or '"zarr" driver' in message
    return not (orbax_task or tensorstore_read)


def drop_stray_orbax_reports() -> None:
    """Orbax reads and writes a checkpoint's arrays in asyncio tasks on tensorstore threads.
    When one of them fails, orbax raises at once and closes its event loop, and the others
    report later, by thread timing (none to a few dozen per failure): a read still in flight
    calls back into the closed loop (an unraisable "Event loop is closed"), and a task that
    failed too is logged by asyncio as "Task exception was never retrieved"; each prints a
    traceback. They say nothing the raised error does not, so both are dropped (every other
    unraisable and asyncio record passes). Installing this twice is harmless."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_stray_orbax_reports", False):
        return

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if not _is_closed_loop_report(unraisable):
            previous(unraisable)

    hook.drops_stray_orbax_reports = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_not_an_orbax_task_report)


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """Around a restore that may fail: orbax logs a failed restore with its whole traceback,
    and its other reads report later (`drop_stray_orbax_reports`); the caller reports the
    failure in one line."""
    drop_stray_orbax_reports()
    loggers = [logging.getLogger(name) for name in ("absl", "orbax", "orbax.checkpoint")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def first_line(error: BaseException) -> str:
    """The error's type and first line, without the tensorstore specs orbax's errors append."""
    text = str(error).strip().splitlines()
    line = text[0].split(" [tensorstore_spec", 1)[0] if text else ""
    return f"{type(error).__name__}: {line}"
