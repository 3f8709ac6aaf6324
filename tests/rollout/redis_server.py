"""A throwaway `redis-server` for tests: free loopback port, no persistence, private directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import redis


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """Runs `redis-server` in `workdir` until `stop()`; `url` points at database 0."""

    def __init__(self, workdir: str | os.PathLike[str], attempts: int = 3) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(binary):
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.workdir = os.fspath(workdir)
        last_log = ""
        for _ in range(attempts):  # another process may take the port between probe and bind
            self.port = free_loopback_port()
            log_path = os.path.join(self.workdir, f"redis-{self.port}.log")
            self._process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.workdir, "--logfile", log_path,
                 "--daemonize", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return
            self.stop()
            last_log = open(log_path).read() if os.path.exists(log_path) else ""
        raise RuntimeError(f"redis-server did not start after {attempts} attempts:\n{last_log}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, limit_s: float = 20.0) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
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
