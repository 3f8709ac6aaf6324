"""What user code prints: a capped capture fed by `sys.stdout` / `sys.stderr` and by a pipe that
stands in for descriptors 1 and 2."""

from __future__ import annotations

import builtins
import io
import os
import select
import threading

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring

CAPTURE_WRITE_FD = 1019
CAPTURE_READ_FD = 1020

_os_read = os.read
_bytes_join = b"".join


class OutputCapture:
    """Keeps the first `limit` bytes written during a call and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0

    def reset(self) -> None:
        with self.lock:
            self.parts = []
            self.size = 0
            self.dropped = 0

    def add(self, data: bytes) -> None:
        with self.lock:
            room = self.limit - self.size
            if room > 0:
                kept = data[:room]
                self.parts.append(bytes(kept))
                self.size += len(kept)
                self.dropped += len(data) - len(kept)
            else:
                self.dropped += len(data)

    def take(self) -> tuple[str, int]:
        with self.lock:
            text = _bytes_join(self.parts).decode("utf-8", "replace")
            dropped = self.dropped
        return text, dropped


class CaptureStream(io.TextIOBase):
    """`sys.stdout` / `sys.stderr` during user code."""

    def __init__(self, capture: OutputCapture, fd: int):
        self._capture = capture
        self._fd = fd

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def errors(self) -> str:
        return "replace"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._capture.add(text.encode("utf-8", "replace"))
        return len(text)

    def flush(self) -> None:
        pass


class DescriptorDrain:
    """Moves bytes written to descriptors 1 and 2 into the capture."""

    def __init__(self, capture: OutputCapture, fd: int):
        self._capture = capture
        self._fd = fd
        self._lock = threading.Lock()
        os.set_blocking(fd, False)

    def _drain_available(self) -> None:
        while True:
            try:
                data = _os_read(self._fd, 1 << 20)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            self._capture.add(data)

    def run_forever(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while True:
            events = poller.poll()
            with self._lock:
                self._drain_available()
            if any(event & (select.POLLERR | select.POLLNVAL) for _, event in events):
                return  # user code closed the pipe: nothing more can arrive

    def sync(self) -> None:
        """Collect everything already written; called at the end of each request."""
        with self._lock:
            try:
                self._drain_available()
            except OSError:
                pass
