"""`SandboxPool`: sandboxes started ahead of time, each handed out once and destroyed when it
comes back; their runtimes are forked from the pool's template (`ForkServer`) where the host
allows it."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxError, SandboxStartError
from pyvision_jax.agent.sandbox.fork_server import ForkServer
from pyvision_jax.agent.sandbox.isolation import isolation_mode
from pyvision_jax.agent.sandbox.registry import LIVE_POOLS, install_shutdown_hooks
from pyvision_jax.agent.sandbox.sandbox import Sandbox


class SandboxPool:
    """Keeps `size` sandboxes started (imports done) so that `acquire` is fast.

    A released sandbox is destroyed in the background, never handed out again. Thread-safe.
    """

    def __init__(self, config: SandboxConfig | None = None, size: int = 4, start_workers: int | None = None):
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size!r}")
        self.config = config or SandboxConfig()
        self.size = size
        mode, bwrap = isolation_mode(self.config)
        self._memory = SandboxMemory.for_pool(self.config.memory_bytes)
        self._server = (
            ForkServer(self.config, mode, bwrap) if self.config.fork_runtimes and mode != "unisolated" else None
        )
        install_shutdown_hooks()
        self._cond = threading.Condition(threading.RLock())
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._leased: set[Sandbox] = set()
        self._retired: collections.deque[Sandbox] = collections.deque()
        self._starting = 0
        self._closed = False
        self._closing = threading.Event()
        self._start_error: BaseException | None = None
        workers = start_workers or max(1, min(size, os.cpu_count() or 1))
        self._workers = [
            threading.Thread(target=self._maintain, name=f"sandbox-pool-{i}", daemon=True) for i in range(workers)
        ]
        LIVE_POOLS.add(self)
        for worker in self._workers:
            worker.start()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def idle_count(self) -> int:
        with self._cond:
            return len(self._idle)

    @property
    def template_pid(self) -> int | None:
        """Host pid of the running template's bubblewrap (None: runtimes are not forked)."""
        return None if self._server is None else self._server.template_pid

    def _maintain(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._retired and (len(self._idle) + self._starting >= self.size):
                    self._cond.wait()
                if self._closed:
                    return
                retired = list(self._retired)
                self._retired.clear()
                start = len(self._idle) + self._starting < self.size
                if start:
                    self._starting += 1
            for sandbox in retired:
                sandbox.close()
            if not start:
                continue
            try:
                sandbox = Sandbox(self.config, cancel=self._closing, server=self._server, memory=self._memory)
            except BaseException as exc:  # noqa: BLE001 - surfaced by acquire
                with self._cond:
                    self._starting -= 1
                    if self._closed:
                        return
                    self._start_error = exc
                    self._cond.notify_all()
                time.sleep(1.0)
                continue
            with self._cond:
                self._starting -= 1
                if self._closed:
                    keep = False
                else:
                    keep = True
                    self._start_error = None
                    self._idle.append(sandbox)
                    self._cond.notify_all()
            if not keep:
                sandbox.close()

    def acquire(self, timeout_s: float | None = None) -> Sandbox:
        """A started sandbox of its own for the caller; TimeoutError if none is ready in time."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                while self._idle:
                    sandbox = self._idle.popleft()
                    self._cond.notify_all()
                    if sandbox.alive():
                        self._leased.add(sandbox)
                        return sandbox
                    self._retired.append(sandbox)
                if self._start_error is not None and not self._starting:
                    raise SandboxStartError(
                        f"the pool cannot start sandboxes: {self._start_error}"
                    ) from self._start_error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no sandbox became ready within {timeout_s} s")
                self._cond.wait(remaining)

    def release(self, sandbox: Sandbox) -> None:
        """Gives a sandbox back; it is destroyed and a fresh one is started."""
        with self._cond:
            if sandbox not in self._leased:
                raise ValueError("release() got a sandbox this pool did not hand out")
            self._leased.discard(sandbox)
            if self._closed:
                closing_now = True
            else:
                closing_now = False
                self._retired.append(sandbox)
                self._cond.notify_all()
        if closing_now:
            sandbox.close()

    def close(self) -> None:
        """Destroys every sandbox of the pool, leased ones included; idempotent."""
        with self._cond:
            self._closed = True
            self._closing.set()
            self._cond.notify_all()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join()
        with self._cond:
            sandboxes = list(self._idle) + list(self._leased) + list(self._retired)
            self._idle.clear()
            self._leased.clear()
            self._retired.clear()
        for sandbox in sandboxes:
            sandbox.close()
        if self._server is not None:
            self._server.close()
        LIVE_POOLS.discard(self)
