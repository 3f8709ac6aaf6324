"""`RuntimeTemplate`: the host's side of one template process (the `runtime.template` program in
bubblewrap), which forks runtimes on request."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pyvision_jax.agent.sandbox.channel import CallTimeout, wait_ready
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxStartError
from pyvision_jax.agent.sandbox.font_cache import matplotlib_font_cache
from pyvision_jax.agent.sandbox.isolation import (
    SANDBOX_FONT_CACHE,
    SANDBOX_HOSTS,
    SANDBOX_MEDIA,
    SANDBOX_RUNTIME_DIR,
    SANDBOX_WORKDIR,
    python_roots_in_workdir,
    template_bwrap_command,
)
from pyvision_jax.agent.sandbox.launched import LaunchedProcess
from pyvision_jax.agent.sandbox.process import runtime_command
from pyvision_jax.agent.sandbox.runtime.protocol import READY_OP, TEMPLATE_FLAG
from pyvision_jax.agent.sandbox.seccomp import seccomp_program

_MAX_REPLY_BYTES = 1 << 16


class TemplateGone(SandboxStartError):
    """The template died or stopped answering; a fresh one can be started."""


class RuntimeTemplate:
    """One running template: its process tree (in bubblewrap) and its control socket.

    `hosts_dir` holds the host directories of the sandboxes whose runtimes it forks; each
    fork sees only its own sandbox's media. Thread-safe: forks are made one at a time, and
    each forked runtime then starts on its own.
    """

    def __init__(
        self,
        config: SandboxConfig,
        mode: str,
        bwrap: str,
        hosts_dir: Path,
        log_path: Path,
        cancelled: Callable[[], bool],
    ):
        self.mode = mode
        self._lock = threading.Lock()
        self._gone = False
        self.control, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_read, info_write = os.pipe()
        font_cache = matplotlib_font_cache()
        program = seccomp_program()
        settings: dict[str, Any] = {
            "control_fd": template_end.fileno(),
            "mode": mode,
            "seccomp": None if program is None else base64.b64encode(program).decode(),
            "font_cache": font_cache and SANDBOX_FONT_CACHE,
            "workdir": SANDBOX_WORKDIR,
            "kept_in_workdir": python_roots_in_workdir(),
            "hosts_dir": SANDBOX_HOSTS,
            "media_dir": SANDBOX_MEDIA,
        }
        argv = template_bwrap_command(bwrap, config, mode, str(hosts_dir), info_write, font_cache)
        argv += runtime_command(SANDBOX_RUNTIME_DIR) + [TEMPLATE_FLAG, json.dumps(settings)]
        try:
            self._launched = LaunchedProcess(
                argv,
                [template_end.fileno(), info_write],
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                "/",
                log_path,
                info_read,
            )
        except BaseException:
            self.control.close()
            os.close(info_read)
            raise
        finally:
            template_end.close()
            os.close(info_write)
        try:
            deadline = time.monotonic() + config.startup_timeout_s
            self._launched.find_inner(deadline, cancelled)
            ready, _ = self._receive(deadline, cancelled)
            if ready.get("op") != READY_OP:
                raise SandboxStartError(f"unexpected first message {ready!r}")
        except BaseException as exc:
            self.close()
            if isinstance(exc, SandboxStartError) and not isinstance(exc, TemplateGone):
                raise
            raise SandboxStartError(
                f"the runtime template did not start ({type(exc).__name__}: {exc}); "
                f"launcher output: {self._launched.log_tail()}"
            ) from exc

    @property
    def pid(self) -> int:
        """Host pid of the template's outermost process (bubblewrap)."""
        return self._launched.pid

    def alive(self) -> bool:
        return not self._gone and self._launched.poll() is None

    def ended(self, wait_s: float) -> bool:
        """Whether the template has ended (waiting up to `wait_s` seconds for it to)."""
        if self._launched.wait(wait_s) is not None:
            self._gone = True
        return self._gone

    def _receive(self, deadline: float, cancelled: Callable[[], bool]) -> tuple[dict[str, Any], list[int]]:
        """The template's next message and the descriptors that came with it."""
        try:
            wait_ready(self.control.fileno(), deadline, cancelled)
            message, fds, _, _ = socket.recv_fds(self.control, _MAX_REPLY_BYTES, 1)
        except (CallTimeout, OSError) as exc:
            self._gone = True
            raise TemplateGone(f"the runtime template stopped answering ({type(exc).__name__})") from exc
        if not message:
            self._gone = True
            raise TemplateGone("the runtime template exited")
        return json.loads(message), fds

    def fork(self, request: dict[str, Any], fds: list[int], timeout_s: float) -> tuple[int, float]:
        """Forks one runtime with `fds` (its request, reply and status pipe ends); returns
        the pidfd of its init and the CPU seconds the fork cost inside the template."""
        with self._lock:
            if self._gone:
                raise TemplateGone("the runtime template is gone")
            try:
                socket.send_fds(self.control, [json.dumps(request).encode()], fds)
            except OSError as exc:
                self._gone = True
                raise TemplateGone(f"the runtime template is gone ({exc})") from exc
            reply, pidfds = self._receive(time.monotonic() + timeout_s, lambda: False)
        if reply.get("error") is not None or len(pidfds) != 1:
            for fd in pidfds:
                os.close(fd)
            raise SandboxStartError(f"the runtime could not be forked: {reply.get('error')}")
        return pidfds[0], float(reply["cpu_s"])

    def close(self) -> None:
        """Kills the template and every runtime forked from it."""
        self._gone = True
        self._launched.kill()
        self.control.close()
