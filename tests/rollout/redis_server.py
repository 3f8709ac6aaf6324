"""A throwaway `redis-server` for tests: free loopback port, private directory, no persistence
unless asked (AOF with fsync always), and kill/restart on the same port for outage tests.
`conf_lines` go into a redis.conf the server reads first (ACL users, TLS); `auth` is the
(user, password) the readiness check logs in with when the default user is off."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence

import redis


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """Runs `redis-server` in `workdir` until `stop()`; `url` points at database 0."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        attempts: int = 3,
        persistent: bool = False,
        conf_lines: Sequence[str] = (),
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(self.binary):
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.workdir = os.fspath(workdir)
        self.persistent = persistent
        self.auth = auth
        self._conf = os.path.join(self.workdir, "redis.conf")
        with open(self._conf, "w") as conf:
            conf.write("".join(f"{line}\n" for line in conf_lines))
        last_log = ""
        for _ in range(attempts):  # another process may take the port between probe and bind
            self.port = free_loopback_port()
            if self._launch():
                return
            self.stop()
            last_log = open(self._log_path).read() if os.path.exists(self._log_path) else ""
        raise RuntimeError(f"redis-server did not start after {attempts} attempts:\n{last_log}")

    @property
    def _log_path(self) -> str:
        return os.path.join(self.workdir, f"redis-{self.port}.log")

    def _launch(self) -> bool:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self._process = subprocess.Popen(
            [
                self.binary,
                self._conf,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--dir",
                self.workdir,
                "--logfile",
                self._log_path,
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        return self._wait_ready()

    def kill(self) -> None:
        """SIGKILL: the server dies at once (an outage)."""
        self._process.kill()
        self._process.wait()

    def restart(self) -> None:
        """Starts again on the same port (with the same data when persistent)."""
        if not self._launch():
            raise RuntimeError(f"redis-server did not restart on port {self.port}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, limit_s: float = 20.0) -> bool:
        username, password = self.auth or (None, None)
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=1, username=username, password=password
        )
        deadline = time.monotonic() + limit_s
        try:
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
