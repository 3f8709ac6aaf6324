"""Starts runtime processes from one thread that lives as long as the owner process."""

from __future__ import annotations

import concurrent.futures
import os
import queue
import subprocess
import threading
from typing import Any


class Launcher:
    """Starts launcher processes from one thread that lives as long as the owner process.

    bubblewrap's --die-with-parent kills the sandbox when the *thread* that started it exits,
    so sandboxes started from short-lived threads (pool workers, restarts) must not be
    started there; in exchange, every sandbox dies with its owner, even on SIGKILL.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._owner_pid: int | None = None

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """`subprocess.Popen(argv, **kwargs)`, run on the launcher thread."""
        with self._lock:
            if self._owner_pid != os.getpid():  # first use, or a forked copy of the owner
                self._owner_pid = os.getpid()
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._queue,), name="sandbox-launcher", daemon=True).start()
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put((future, argv, kwargs))
        return future.result()

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            future, argv, kwargs = requests.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(subprocess.Popen(argv, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                    future.set_exception(exc)


LAUNCHER = Launcher()
