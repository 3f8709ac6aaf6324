"""What the host holds of any started runtime, however it was started (`process.RuntimeProcess`
launches one, `forked.ForkedRuntime` forks one from a template): its channel, its memory
cgroup and uid, calls, a start that can be cancelled, and a kill that is done once."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from pyvision_jax.agent.sandbox.cgroups import MemoryCgroup
from pyvision_jax.agent.sandbox.channel import ChannelClosed, RuntimeChannel
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.uids import claim_uid, release_uid


class RuntimeHandle:
    """The shared part of a started runtime. The constructor claims a uid (root mode) and
    opens the channel's pipes; `_child_fds` are the ends the runtime inherits (request read,
    reply write). Subclasses start the runtime, set `_cgroup` where they make one, and end
    their processes in `_end_processes`.

    `cancelled` is consulted while the runtime starts; once it answers True the start is
    abandoned (the channel raises, and the subclass turns that into SandboxStartError).
    """

    def __init__(self, config: SandboxConfig, mode: str, cancelled: Callable[[], bool]):
        self.config = config
        self.mode = mode
        self._cancelled = cancelled
        self._starting = True
        self._kill_lock = threading.RLock()
        self._killed = False
        self._cgroup: MemoryCgroup | None = None
        self.uid = claim_uid() if mode == "root" else None
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self._channel = RuntimeChannel(request_write, reply_read, config, self._start_cancelled)
        self._child_fds = [request_read, reply_write]

    @property
    def killed(self) -> bool:
        return self._killed

    def _start_cancelled(self) -> bool:
        return self._starting and self._cancelled()

    def call(self, message: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Sends one request and returns its reply; raises CallTimeout, ChannelClosed or
        ProtocolError (after which the runtime must be killed)."""
        if self._killed:
            raise ChannelClosed()
        return self._channel.call(message, timeout_s)

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for reaching the sandbox's memory
        limit (0 where memory is limited per process)."""
        return 0 if self._cgroup is None else self._cgroup.oom_kills()

    def _release(self) -> None:
        """Gives back what the handle holds besides processes: cgroup, uid, channel."""
        if self._cgroup is not None:
            self._cgroup.remove()
        release_uid(self.uid)
        self._channel.close()

    def _end_processes(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Kills the runtime and everything in its namespace (waiting until it has ended),
        then removes its memory cgroup and releases its uid and channel; once."""
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
            self._end_processes()
            self._release()
