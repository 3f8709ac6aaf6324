"""Host directories of sandboxes (the copied media of each): each is locked by its owner for as
long as the owner lives, and the next owner sweeps those of owners that died."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from pathlib import Path

HOST_DIR_PREFIX = "pyvision_sandbox_"
OWNER_LOCK_NAME = "owner.lock"

_swept = False
_swept_lock = threading.Lock()


def _lock_host_dir(host_dir: Path) -> int:
    """Holds an exclusive lock on the sandbox's host directory for as long as its owner lives
    (the kernel drops it when the owner dies, however it dies). The lock file is locked before
    it gets its final name, so a sweeper never sees it unlocked while its owner is alive."""
    fd, path = tempfile.mkstemp(dir=host_dir)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(path, host_dir / OWNER_LOCK_NAME)
    return fd


def create_host_dir(parent: Path | None = None) -> tuple[Path, int]:
    """A new host directory in `parent` (default: the temp dir, where abandoned ones are
    swept; those inside one are removed with it), and the descriptor of its owner lock."""
    host_dir = Path(tempfile.mkdtemp(prefix=HOST_DIR_PREFIX, dir=parent))
    return host_dir, _lock_host_dir(host_dir)


def remove_host_dir(host_dir: Path, owner_lock: int) -> None:
    """Removes a host directory and lets go of its owner lock."""
    shutil.rmtree(host_dir, ignore_errors=True)
    os.close(owner_lock)


def sweep_abandoned_host_dirs() -> None:
    """Removes host directories (copied media) left by owners that died without cleaning up."""
    for directory in Path(tempfile.gettempdir()).glob(HOST_DIR_PREFIX + "*"):
        lock_path = directory / OWNER_LOCK_NAME
        try:
            if directory.lstat().st_uid != os.geteuid():
                continue
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # not a sandbox directory, another user's, or one being created
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


def sweep_abandoned_host_dirs_once() -> None:
    """sweep_abandoned_host_dirs, the first time it is called in this process."""
    global _swept
    with _swept_lock:
        if _swept:
            return
        _swept = True
    sweep_abandoned_host_dirs()
