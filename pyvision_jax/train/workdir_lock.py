"""One trainer per workdir: an exclusive `flock` on WORKDIR/.lock, held for the run's life.

The kernel releases a flock when its holder exits in any way, kill -9 included, so a lock
left by a dead trainer is stale by construction: the next run takes it, reads who held it
before and says so. The file records the holder's pid, host and start time, which a second
trainer's refusal names. In a multi-host run process 0 alone takes the lock. Within one
process the lock is reentrant (the command takes it before its held-out evaluation, the run
harness again when training starts); the last `release` gives it back.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from pyvision_jax.convert.run_layout import LOCK_FILE

_HELD: dict[Path, list[int]] = {}
"""Locks this process holds: path -> [file descriptor, holders]."""


class WorkdirLockedError(RuntimeError):
    """Another live trainer holds the workdir (the message names its pid and host)."""


class WorkdirLock:
    """Take with `acquire` (raises `WorkdirLockedError` when held), give back with `release`."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = Path(workdir).absolute() / LOCK_FILE
        self._fd: int | None = None
        self.previous: dict[str, Any] | None = None
        """The record a dead holder left (a stale lock), when there was one."""

    def acquire(self) -> None:
        if self._fd is not None:
            return
        if self.path in _HELD:
            _HELD[self.path][1] += 1
            self._fd = _HELD[self.path][0]
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise WorkdirLockedError(
                f"{self.path.parent} is in use by another trainer (pid {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')}, started {holder.get('started', '?')}); stop it first or use another "
                f"--workdir"
            ) from None
        self.previous = _read(fd) or None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _HELD[self.path] = [fd, 1]

    def release(self) -> None:
        if self._fd is None:
            return
        self._fd = None
        held = _HELD[self.path]
        held[1] -= 1
        if held[1] > 0:
            return
        fd = _HELD.pop(self.path)[0]
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.release()


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
