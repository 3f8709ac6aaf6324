"""A process tree started by the launcher thread, inside bubblewrap or unisolated, and how to
kill all of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable

import psutil

from pyvision_jax.agent.sandbox.channel import wait_ready
from pyvision_jax.agent.sandbox.launcher import LAUNCHER


class LaunchedProcess:
    """One process started by the launcher (bubblewrap, or the runtime itself unisolated).

    With bubblewrap, `info_fd` is the read end of its --info-fd pipe: `find_inner` reads the
    pid of its child there (the first process of its PID namespace, whose death ends the
    namespace) and keeps a pidfd of it for `kill`.
    """

    def __init__(
        self, argv: list[str], pass_fds: list[int], env: dict[str, str], cwd: str, log_path: Path, info_fd: int | None
    ):
        self._log_path = log_path
        self._info_fd = info_fd
        self._isolated = info_fd is not None
        self._pidfd: int | None = None
        self.inner_pid: int | None = None
        with open(log_path, "wb") as log:
            self.process = LAUNCHER.popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                pass_fds=pass_fds,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def find_inner(self, deadline: float, cancelled: Callable[[], bool]) -> None:
        """Learns the pid of the namespace's first process (from bubblewrap's JSON status, read
        to its end) and opens a pidfd of it."""
        if self._info_fd is None:
            self.inner_pid = self.process.pid
        else:
            data = b""
            while True:
                wait_ready(self._info_fd, deadline, cancelled)
                chunk = os.read(self._info_fd, 65536)
                if not chunk:
                    break
                data += chunk
            os.close(self._info_fd)
            self._info_fd = None
            self.inner_pid = json.loads(data)["child-pid"]
        try:
            self._pidfd = os.pidfd_open(self.inner_pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, wait_s: float) -> int | None:
        """The exit status of the launched process, or None if it is still running after
        `wait_s` seconds."""
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self) -> str:
        """The end of what the launched process wrote to stderr, or '(none)'."""
        try:
            text = self._log_path.read_bytes()[-4000:].decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        return text or "(none)"

    def kill(self) -> None:
        """Kills the process and everything in its namespace, and reaps it.

        The launched process's own children go first: bubblewrap's first child waits to be
        released by its parent after it is cloned, and killing only the parent would strand
        it."""
        killed_inside = False
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                killed_inside = True
            except ProcessLookupError:
                pass
        try:
            descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        for proc in descendants:
            try:
                proc.kill()
                killed_inside = True
            except psutil.Error:
                pass
        if not self._isolated or not killed_inside or self.wait(5.0) is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait()
        for fd in (self._pidfd, self._info_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pidfd = self._info_fd = None
