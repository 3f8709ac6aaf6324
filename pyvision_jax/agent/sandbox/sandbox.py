"""`Sandbox`: a persistent, isolated Python runtime for model-written code, restarted (with its
preloaded media restored) whenever a call kills it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from PIL import Image

from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.channel import CallTimeout, ChannelClosed, ProtocolError
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxError
from pyvision_jax.agent.sandbox.fork_server import ForkServer
from pyvision_jax.agent.sandbox.forked import ForkedRuntime
from pyvision_jax.agent.sandbox.host_dirs import create_host_dir, remove_host_dir, sweep_abandoned_host_dirs_once
from pyvision_jax.agent.sandbox.isolation import isolation_mode
from pyvision_jax.agent.sandbox.media import check_variable_name, stage_media
from pyvision_jax.agent.sandbox.process import RuntimeProcess, describe_exit
from pyvision_jax.agent.sandbox.registry import LIVE_SANDBOXES, install_shutdown_hooks
from pyvision_jax.agent.sandbox.results import STATE_LOST_NOTICE, RunResult, reply_error, reply_images, reply_stdout

Runtime = RuntimeProcess | ForkedRuntime


class Sandbox:
    """An isolated Python runtime whose variables persist across `run` calls."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        cancel: threading.Event | None = None,
        server: ForkServer | None = None,
        memory: SandboxMemory | None = None,
    ):
        """Starts the runtime (blocking); setting `cancel` abandons a start in progress.
        With `server` (a pool's), runtimes are forked from its template where this host
        allows it, else each starts in a fresh bubblewrap. Each runtime is held to the
        config's memory limit by `memory` (default: a memory cgroup per runtime where this
        process can make them)."""
        self.config = config or SandboxConfig()
        self._server = server
        self._memory = memory or SandboxMemory.for_sandbox(self.config.memory_bytes)
        self._mode, self._bwrap = isolation_mode(self.config)
        self._cancel = cancel
        self._closing = threading.Event()
        install_shutdown_hooks()
        self._lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._closed = False
        self._state_lost = False
        self._preloads: list[dict[str, str]] = []
        self._restart_thread: threading.Thread | None = None
        self._restarted: Runtime | BaseException | None = None
        sweep_abandoned_host_dirs_once()
        self._host_dir, self._owner_lock = create_host_dir() if server is None else server.create_host_dir()
        try:
            (self._host_dir / "media").mkdir(mode=0o755)
            (self._host_dir / "media").chmod(0o755)
            if self._mode == "unisolated":
                (self._host_dir / "work").mkdir(mode=0o700)
            self._runtime: Runtime | None = self._start_runtime()
        except BaseException:
            remove_host_dir(self._host_dir, self._owner_lock)
            raise
        LIVE_SANDBOXES.add(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """Host pid of the current runtime's outermost process (bwrap, or the init of a
        forked runtime), for monitoring."""
        runtime = self._runtime
        return None if runtime is None or runtime.killed else runtime.pid

    @property
    def uid(self) -> int | None:
        """The uid the current runtime runs as when the host runs as root, else None."""
        runtime = self._runtime
        return None if runtime is None else runtime.uid

    def alive(self) -> bool:
        """Whether the current runtime process is running (False while it restarts)."""
        runtime = self._runtime
        return runtime is not None and runtime.running()

    @property
    def isolated(self) -> bool:
        return self._mode != "unisolated"

    @property
    def forked(self) -> bool:
        """Whether the current runtime is a fork of a pool's template."""
        return isinstance(self._runtime, ForkedRuntime)

    def _start_runtime(self) -> Runtime:
        runtime = None
        if self._server is not None:
            runtime = self._server.start_runtime(self._host_dir, self._start_cancelled, self._memory)
        if runtime is None:
            runtime = RuntimeProcess(
                self.config, self._mode, self._bwrap, self._host_dir, self._start_cancelled, self._memory
            )
        try:
            for request in self._preloads:
                self._call_preload(runtime, request)
        except BaseException:
            runtime.kill()
            raise
        return runtime

    def _start_cancelled(self) -> bool:
        return self._closing.is_set() or (self._cancel is not None and self._cancel.is_set())

    def _call_preload(self, runtime: Runtime, request: dict[str, str]) -> None:
        message = dict(request, path=f"{runtime.media_root}/{request['file']}") if "file" in request else request
        try:
            reply, _ = runtime.call(message, self.config.preload_timeout_s)
        except (CallTimeout, ChannelClosed, ProtocolError) as exc:
            runtime.kill()
            raise SandboxError(
                f"{request['op']} of {request['name']!r} failed: the runtime {type(exc).__name__}"
            ) from exc
        if reply.get("error"):
            raise SandboxError(f"{request['op']} of {request['name']!r} failed: {reply['error']}")

    def _restart_in_background(self) -> None:
        try:
            runtime: Runtime | BaseException = self._start_runtime()
        except BaseException as exc:  # noqa: BLE001 - handed to the next call
            runtime = exc
        with self._state_lock:
            self._restarted = runtime
            closed = self._closed
        if closed and isinstance(runtime, Runtime):
            runtime.kill()

    def _discard_runtime(self) -> None:
        """Kills the current runtime and starts its replacement in the background."""
        with self._state_lock:
            runtime, self._runtime = self._runtime, None
            self._state_lost = True
            if runtime is not None:
                runtime.kill()
            if not self._closed:
                self._restarted = None
                self._restart_thread = threading.Thread(
                    target=self._restart_in_background, name="sandbox-restart", daemon=True
                )
                self._restart_thread.start()

    def _ready_runtime(self) -> Runtime:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._runtime is not None:
            return self._runtime
        if self._restart_thread is not None:
            self._restart_thread.join()
            self._restart_thread = None
        with self._state_lock:
            restarted, self._restarted = self._restarted, None
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if isinstance(restarted, Runtime):
            self._runtime = restarted
        else:
            self._runtime = self._start_runtime()
        return self._runtime

    def run(self, code: str) -> RunResult:
        """Runs `code` in the persistent namespace; never raises for problems of the code."""
        if not isinstance(code, str):
            raise TypeError(f"Sandbox.run expects code as str, got {type(code).__name__}")
        with self._lock:
            runtime = self._ready_runtime()
            state_lost, self._state_lost = self._state_lost, False
            notice = STATE_LOST_NOTICE if state_lost else ""
            start = time.monotonic()
            oom_kills = runtime.oom_kills()
            try:
                reply, blob = runtime.call({"op": "run", "code": code}, self.config.timeout_s)
            except CallTimeout:
                self._discard_runtime()
                return RunResult(
                    stdout=notice,
                    images=[],
                    timed_out=True,
                    state_lost=state_lost,
                    wall_time_s=time.monotonic() - start,
                    error=(
                        f"TimeoutError: the code did not finish within "
                        f"{self.config.timeout_s:g} s and was stopped; the Python session "
                        f"was restarted and its variables are lost"
                    ),
                )
            except (ChannelClosed, ProtocolError) as exc:
                status = runtime.exit_status(1.0) if isinstance(exc, ChannelClosed) else None
                oom_kills = runtime.oom_kills() - oom_kills
                self._discard_runtime()
                if self._closed:
                    reason = "the sandbox was closed during the call"
                elif isinstance(exc, ProtocolError):
                    reason = f"the runtime broke its reply channel ({exc})"
                elif oom_kills:
                    reason = f"the Python process was killed: {self._memory_exceeded(oom_kills)}"
                else:
                    reason = f"the Python process {describe_exit(status, self.config)}"
                return self._crash_result(notice, state_lost, time.monotonic() - start, reason)
            wall_time_s = time.monotonic() - start
            try:
                images = reply_images(reply, blob, self.config)
                stdout = reply_stdout(reply, self.config)
            except ProtocolError as exc:
                self._discard_runtime()
                return self._crash_result(notice, state_lost, wall_time_s, str(exc))
            error = reply_error(reply)
            oom_kills = runtime.oom_kills() - oom_kills
            if oom_kills:
                error = "\n".join(filter(None, [error, f"MemoryError: {self._memory_exceeded(oom_kills)}"]))
            return RunResult(
                stdout=notice + stdout,
                images=images,
                error=error,
                timed_out=False,
                wall_time_s=wall_time_s,
                state_lost=state_lost,
            )

    def _memory_exceeded(self, killed: int) -> str:
        return (
            f"the sandbox's processes together reached its memory limit of "
            f"{self.config.memory_bytes / (1 << 20):g} MiB and the kernel killed {killed} "
            f"of them"
        )

    @staticmethod
    def _crash_result(notice: str, state_lost: bool, wall_time_s: float, reason: str) -> RunResult:
        return RunResult(
            stdout=notice,
            images=[],
            timed_out=False,
            state_lost=state_lost,
            wall_time_s=wall_time_s,
            error=(f"SandboxCrash: {reason}; the Python session was restarted and its variables are lost"),
        )

    def _preload(self, op: str, name: str, source: Image.Image | str | Path, suffix: str) -> None:
        check_variable_name(name)
        with self._lock:
            runtime = self._ready_runtime()
            filename = stage_media(self._host_dir / "media", name, source, suffix)
            self._install_preload(runtime, {"op": op, "name": name, "file": filename})

    def _install_preload(self, runtime: Runtime, request: dict[str, str]) -> None:
        """Runs `request` in `runtime` and keeps it for every replacement runtime (under `_lock`)."""
        try:
            self._call_preload(runtime, request)
        finally:
            if runtime.killed:
                self._discard_runtime()
        self._preloads = [r for r in self._preloads if r["name"] != request["name"]] + [request]

    def preload_image(self, name: str, image: Image.Image | str | Path) -> None:
        """Defines `name` in the runtime as the full-resolution RGB PIL image."""
        if not isinstance(image, (Image.Image, str, Path)):
            raise TypeError(f"preload_image({name!r}) expects a PIL image or a path, got {type(image).__name__}")
        self._preload("load_image", name, image, ".png")

    def preload_video(self, name: str, path: str | Path) -> None:
        """Defines `name` as a decord.VideoReader (and `VideoReader`, `cpu`) in the runtime."""
        if not isinstance(path, (str, Path)):
            raise TypeError(f"preload_video({name!r}) expects a path, got {type(path).__name__}")
        self._preload("load_video", name, path, ".mp4")

    def preload_code(self, name: str, code: str) -> None:
        """Runs trusted setup `code` (helper functions a prompt names) in the runtime before any
        model code, and again in every replacement runtime; `name` identifies it in errors."""
        if not isinstance(code, str):
            raise TypeError(f"preload_code({name!r}) expects the code as a string, got {type(code).__name__}")
        with self._lock:
            self._install_preload(self._ready_runtime(), {"op": "load_code", "name": name, "code": code})

    def close(self) -> None:
        """Kills the runtime (and a replacement being started); idempotent, thread-safe."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.kill()
        thread = self._restart_thread
        if thread is not None:
            thread.join()
        with self._state_lock:
            restarted, self._restarted = self._restarted, None
        if isinstance(restarted, Runtime):
            restarted.kill()
        remove_host_dir(self._host_dir, self._owner_lock)
        LIVE_SANDBOXES.discard(self)
