"""`ForkedRuntime`: the host's side of one runtime forked from a pool's template."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path
from typing import Callable

from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.channel import CallTimeout, ChannelClosed, wait_ready
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxStartError
from pyvision_jax.agent.sandbox.font_cache import matplotlib_font_cache
from pyvision_jax.agent.sandbox.isolation import SANDBOX_FONT_CACHE, SANDBOX_MEDIA, SANDBOX_WORKDIR
from pyvision_jax.agent.sandbox.process import runtime_settings
from pyvision_jax.agent.sandbox.runtime_handle import RuntimeHandle
from pyvision_jax.agent.sandbox.template import RuntimeTemplate, TemplateGone

# How long kill() waits for the init to end (with it, everything in its PID namespace).
_KILL_WAIT_S = 30.0


def _pidfd_host_pid(pidfd: int) -> int:
    """The pid, in this process's PID namespace, of the process a pidfd refers to."""
    with open(f"/proc/self/fdinfo/{pidfd}") as handle:
        for line in handle:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise SandboxStartError("the kernel does not say which process a pidfd refers to")


def _has_exited(pidfd: int, wait_s: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(wait_s * 1000)))


class ForkedRuntime(RuntimeHandle):
    """One runtime forked from a template: its init (PID 1 of its namespaces, `pid` here),
    the runtime under it, and its channel.

    Until the first request no model code has run and the runtime's processes are its init
    and the runtime alone (both known from `pid`), so once the runtime is ready both are moved
    into a memory cgroup of their own (from `memory`, where it makes them). `fork_cpu_s` is
    the CPU the fork cost inside the template (the template and the short-lived process that
    made the namespaces). `cancelled` is consulted while the runtime starts.
    """

    def __init__(
        self,
        template: RuntimeTemplate,
        config: SandboxConfig,
        host_dir: Path,
        cancelled: Callable[[], bool],
        memory: SandboxMemory | None = None,
    ):
        super().__init__(config, template.mode, cancelled)
        self.media_root = SANDBOX_MEDIA
        self._exit_status: int | None = None
        request_read, reply_write = self._child_fds
        self._status_fd, status_write = os.pipe()
        font_cache = matplotlib_font_cache() and SANDBOX_FONT_CACHE
        request = {
            "sandbox": host_dir.name,
            "tmpfs_bytes": config.tmpfs_bytes,
            "runtime": runtime_settings(config, self.mode, SANDBOX_WORKDIR, self.uid, font_cache),
        }
        deadline = time.monotonic() + config.startup_timeout_s
        try:
            self._pidfd, self.fork_cpu_s = template.fork(
                request, [request_read, reply_write, status_write], config.startup_timeout_s
            )
        except BaseException:
            self._release()
            os.close(self._status_fd)
            raise
        finally:
            for fd in (request_read, reply_write, status_write):
                os.close(fd)
        try:
            self.pid = _pidfd_host_pid(self._pidfd)
            ready = self._channel.receive_ready(deadline)
            if ready.get("error"):
                raise SandboxStartError(f"sandbox runtime failed to start:\n{ready['error']}")
            self._cgroup = None if memory is None else memory.new_cgroup()
            if self._cgroup is not None:
                self._cgroup.add_tree(self.pid)
            self._starting = False
        except BaseException as exc:
            self.kill()
            if isinstance(exc, ChannelClosed) and template.ended(1.0):
                raise TemplateGone("the runtime template ended while a runtime started") from exc
            if isinstance(exc, SandboxStartError):
                raise
            raise SandboxStartError(f"forked sandbox runtime did not start ({type(exc).__name__}: {exc})") from exc

    def running(self) -> bool:
        return not self._killed and not _has_exited(self._pidfd, 0)

    def exit_status(self, wait_s: float) -> int | None:
        """How the runtime ended (its exit code, or 128 + the signal that killed it), as its
        init reports it; None if that is not known within `wait_s` seconds."""
        if self._exit_status is None and not self._killed:
            try:
                wait_ready(self._status_fd, time.monotonic() + wait_s, lambda: False)
                data = os.read(self._status_fd, 4)
            except (CallTimeout, OSError):
                return None
            if len(data) == 4:
                self._exit_status = int.from_bytes(data, "little")
        return self._exit_status

    def _end_processes(self) -> None:
        """Kills the init, which ends everything in the runtime's PID namespace, and waits
        until it has."""
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _has_exited(self._pidfd, _KILL_WAIT_S)
        for fd in (self._pidfd, self._status_fd):
            os.close(fd)
