"""One started runtime process: how it is launched (isolated or not), its channel, and how it
is killed together with everything in its namespace."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxStartError
from pyvision_jax.agent.sandbox.font_cache import matplotlib_font_cache
from pyvision_jax.agent.sandbox.isolation import (
    RUNTIME_DIR,
    RUNTIME_ENTRY,
    SANDBOX_FONT_CACHE,
    SANDBOX_MEDIA,
    SANDBOX_RUNTIME_DIR,
    SANDBOX_WORKDIR,
    bwrap_command,
    runtime_environment,
)
from pyvision_jax.agent.sandbox.launched import LaunchedProcess
from pyvision_jax.agent.sandbox.runtime_handle import RuntimeHandle
from pyvision_jax.agent.sandbox.seccomp import seccomp_program


def runtime_command(runtime_dir: str) -> list[str]:
    """The interpreter command that starts the runtime package found in `runtime_dir`."""
    return [sys.executable, "-I", "-B", f"{runtime_dir}/{RUNTIME_ENTRY}"]


def runtime_settings(
    config: SandboxConfig,
    mode: str,
    workdir: str,
    uid: int | None,
    font_cache: str | None,
    request_fd: int | None = None,
    reply_fd: int | None = None,
) -> dict[str, Any]:
    """The settings a runtime starts with (the descriptors of its channel are those it
    inherits; a fork of the template gets them from the template)."""
    limits = {
        "RLIMIT_AS": config.memory_bytes,
        "RLIMIT_FSIZE": config.max_file_bytes,
        "RLIMIT_CPU": config.cpu_seconds,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": config.max_open_files,
    }
    if mode != "unisolated":  # RLIMIT_NPROC counts per real uid: only meaningful isolated
        limits["RLIMIT_NPROC"] = config.max_processes
    return {
        "request_fd": request_fd,
        "reply_fd": reply_fd,
        "limits": limits,
        "uid": uid,
        "gid": uid,
        "workdir": workdir,
        "font_cache": font_cache,
        "max_stdout_bytes": config.max_stdout_bytes,
        "max_image_pixels": config.max_image_pixels,
        "max_aspect_ratio": config.max_aspect_ratio,
        "max_images_per_call": config.max_images_per_call,
    }


def describe_exit(status: int | None, config: SandboxConfig) -> str:
    """How a runtime that exited with `status` (None: still running) ended, in words."""
    if status is None:
        return "stopped responding"
    signum = -status if status < 0 else status - 128 if status > 128 else None
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        hint = ""
        if signum == signal.SIGKILL:
            hint = f" (the CPU-time limit of {config.cpu_seconds} s or the memory limit may have been reached)"
        return f"was killed by {name}{hint}"
    return f"exited with status {status}"


class RuntimeProcess(RuntimeHandle):
    """One launched runtime: its process (bubblewrap, or the runtime unisolated).

    Where `memory` makes cgroups, the launched process enters one of its own before it
    executes bubblewrap (or the runtime), so the whole tree is born in it.
    """

    def __init__(
        self,
        config: SandboxConfig,
        mode: str,
        bwrap: str | None,
        host_dir: Path,
        cancelled: Callable[[], bool],
        memory: SandboxMemory,
    ):
        super().__init__(config, mode, cancelled)
        media_dir = str(host_dir / "media")
        request_read, reply_write = self._child_fds
        child_fds = list(self._child_fds)
        info_read = info_write = None
        font_cache = matplotlib_font_cache()
        if mode == "unisolated":
            workdir = str(host_dir / "work")
            argv = runtime_command(str(RUNTIME_DIR))
            env = runtime_environment(workdir)
            self.media_root = media_dir
        else:
            workdir = SANDBOX_WORKDIR
            info_read, info_write = os.pipe()
            child_fds.append(info_write)
            seccomp_read = None
            program = seccomp_program()
            if program is not None:
                seccomp_read, seccomp_write = os.pipe()
                os.write(seccomp_write, program)
                os.close(seccomp_write)
                child_fds.append(seccomp_read)
            argv = bwrap_command(bwrap, config, mode, media_dir, info_write, font_cache, seccomp_read)
            argv += runtime_command(SANDBOX_RUNTIME_DIR)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            self.media_root = SANDBOX_MEDIA
            font_cache = font_cache and SANDBOX_FONT_CACHE
        settings = runtime_settings(
            config, mode, workdir, self.uid, font_cache, request_fd=request_read, reply_fd=reply_write
        )
        argv.append(json.dumps(settings))
        try:
            self._cgroup = memory.new_cgroup()
            if self._cgroup is not None:
                argv = self._cgroup.entering_command() + argv
            self._launched = LaunchedProcess(
                argv, child_fds, env, workdir if mode == "unisolated" else "/", host_dir / "launcher.log", info_read
            )
        except BaseException:
            self._release()
            for fd in child_fds + [info_read]:
                if fd is not None:
                    os.close(fd)
            raise
        for fd in child_fds:
            os.close(fd)
        try:
            deadline = time.monotonic() + config.startup_timeout_s
            self._launched.find_inner(deadline, self._start_cancelled)
            ready = self._channel.receive_ready(deadline)
            if ready.get("error"):
                raise SandboxStartError(f"sandbox runtime failed to start:\n{ready['error']}")
            self._starting = False
        except BaseException as exc:
            self.kill()
            if isinstance(exc, SandboxStartError):
                raise
            raise SandboxStartError(
                f"sandbox runtime did not start ({type(exc).__name__}: {exc}); "
                f"launcher output: {self._launched.log_tail()}"
            ) from exc

    @property
    def pid(self) -> int:
        """Host pid of the outermost process (bubblewrap, or the runtime unisolated)."""
        return self._launched.pid

    def running(self) -> bool:
        return not self._killed and self._launched.poll() is None

    def exit_status(self, wait_s: float) -> int | None:
        return self._launched.wait(wait_s)

    def _end_processes(self) -> None:
        """Kills the runtime and everything in its namespace and reaps the launcher."""
        self._launched.kill()
