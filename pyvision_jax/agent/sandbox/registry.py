"""Sandboxes and pools die with their owner: the live ones are registered here and closed at
exit and on SIGTERM (a handler is installed when SIGTERM has none)."""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_registry_lock = threading.Lock()
_hooks_installed = False


class LiveSet:
    """The live objects of one kind, held weakly."""

    def __init__(self) -> None:
        self._items: weakref.WeakSet[Closable] = weakref.WeakSet()

    def add(self, item: Closable) -> None:
        with _registry_lock:
            self._items.add(item)

    def discard(self, item: Closable) -> None:
        with _registry_lock:
            self._items.discard(item)

    def close_all(self) -> None:
        for item in list(self._items):
            item.close()


LIVE_POOLS = LiveSet()
LIVE_SANDBOXES = LiveSet()


def _close_everything() -> None:
    LIVE_POOLS.close_all()
    LIVE_SANDBOXES.close_all()


def _on_sigterm(signum: int, frame: Any) -> None:
    _close_everything()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def install_shutdown_hooks() -> None:
    """Closes all sandboxes at exit and on SIGTERM (when SIGTERM has no other handler)."""
    global _hooks_installed
    with _registry_lock:
        if _hooks_installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        _hooks_installed = True
    atexit.register(_close_everything)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
