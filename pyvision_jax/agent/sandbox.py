"""Isolated, persistent Python runtimes for model-written code, and a warm pool of them.

A `Sandbox` owns one runtime process (`sandbox_runtime.py`) started inside bubblewrap: its own
PID, network (loopback included), IPC and UTS namespaces, a read-only view of the system and
of the Python installation, a size-limited private tmpfs at /tmp as the only writable place,
and the preloaded media under /media (read-only). Hard rlimits bound address space, processes,
file size and CPU seconds; a seccomp filter forbids new user namespaces. Running as root, the
runtime drops to a uid of its own (picked at random per runtime) so that file permissions and
the process limit apply to it; otherwise bubblewrap's user namespace does the same.

Sandboxes die with their owner: on close, at exit, on SIGTERM (a handler is installed when
none is), and even on SIGKILL (bubblewrap's --die-with-parent, and the runtime exits when its
request pipe closes). Copied media of owners that died are swept by the next owner.

Calls are synchronous frames over two pipes, numbered so that a reply can only answer the
request it was sent for. A call that overruns its wall-clock timeout kills the whole runtime
(the sandbox's PID namespace, so threads and children die with it); the next call runs in a
fresh runtime, with the preloaded media restored, and its result has `state_lost=True` and
starts with `STATE_LOST_NOTICE`.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import errno
import fcntl
import importlib.metadata
import json
import keyword
import os
import platform
import queue
import random
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import psutil
from PIL import Image

RUNTIME_FILE = Path(__file__).with_name("sandbox_runtime.py")
STATE_LOST_NOTICE = ("[The Python session was restarted after the previous call failed; "
                     "variables and imports defined by earlier code are lost. "
                     "Preloaded media are available again.]\n")
TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes not shown ...]"

_MAGIC = b"PVSB"
_HEADER = struct.Struct("<4sIQ")
_MAX_REPLY_JSON_BYTES = 64 * 1024 * 1024
_SANDBOX_ROOT = "/opt/pyvision"
_SANDBOX_MEDIA = "/media"
_SANDBOX_FONT_CACHE = f"{_SANDBOX_ROOT}/matplotlib"
_SANDBOX_WORKDIR = "/tmp"
_READY_OP = "ready"
_REPLY_OP = "reply"
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/fonts",
                 "/etc/localtime", "/etc/alternatives", "/etc/mime.types")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits and options of one sandbox.

    timeout_s: wall-clock limit of one call; overrunning it kills the runtime.
    max_stdout_bytes: printed bytes kept per call (the rest is counted and marked).
    max_image_pixels / max_aspect_ratio / max_images_per_call: per-call image guards; an image
      with aspect ratio >= max_aspect_ratio is refused.
    memory_bytes: address-space limit of each sandbox process (RLIMIT_AS).
    max_processes: processes + threads of the sandbox (RLIMIT_NPROC, per runtime uid).
    max_file_bytes: largest file it can write (RLIMIT_FSIZE); tmpfs_bytes: size of its /tmp
      (and a quarter of it for /dev/shm).
    cpu_seconds: CPU seconds for the whole life of one runtime (RLIMIT_CPU).
    allow_unisolated: run without bubblewrap (and without namespaces) where it is missing.
    """

    timeout_s: float = 30.0
    max_stdout_bytes: int = 16_384
    max_image_pixels: int = 16_000_000
    max_aspect_ratio: float = 200.0
    max_images_per_call: int = 8
    memory_bytes: int = 4 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    tmpfs_bytes: int = 256 << 20
    cpu_seconds: int = 600
    max_open_files: int = 1024
    startup_timeout_s: float = 60.0
    preload_timeout_s: float = 60.0
    allow_unisolated: bool = False
    bwrap_path: str | None = None

    def __post_init__(self) -> None:
        positive = ("timeout_s", "max_stdout_bytes", "max_image_pixels", "max_images_per_call",
                    "memory_bytes", "max_processes", "max_file_bytes", "tmpfs_bytes",
                    "cpu_seconds", "startup_timeout_s", "preload_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be positive, got "
                                 f"{getattr(self, name)!r}")
        if self.max_aspect_ratio <= 1:
            raise ValueError(f"SandboxConfig.max_aspect_ratio must be > 1, got "
                             f"{self.max_aspect_ratio!r}")
        if self.max_open_files < 1024:
            raise ValueError(f"SandboxConfig.max_open_files must be >= 1024 (the runtime keeps "
                             f"its channel on high descriptors), got {self.max_open_files!r}")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one `Sandbox.run` call.

    state_lost: this call ran in a fresh runtime because the previous one was killed or died;
      `stdout` then starts with STATE_LOST_NOTICE.
    """

    stdout: str
    images: list[Image.Image]
    error: str | None
    timed_out: bool
    wall_time_s: float
    state_lost: bool


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked (not an error of the code it ran)."""


class SandboxUnavailableError(SandboxError):
    """bubblewrap is missing and the configuration does not allow unisolated runtimes."""


class SandboxStartError(SandboxError):
    """A runtime did not start."""


class _CallTimeout(Exception):
    pass


class _ChannelClosed(Exception):
    pass


class _ProtocolError(Exception):
    pass


_unisolated_warned = False
_unisolated_warned_lock = threading.Lock()


def _isolation_mode(config: SandboxConfig) -> tuple[str, str | None]:
    """("root" | "userns", bwrap path) with bubblewrap, else ("unisolated", None)."""
    global _unisolated_warned
    bwrap = config.bwrap_path or shutil.which("bwrap")
    if bwrap and os.access(bwrap, os.X_OK):
        return ("root" if os.geteuid() == 0 else "userns"), bwrap
    if not config.allow_unisolated:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed, so model-written code cannot be isolated; "
            "install the Debian package 'bubblewrap' or set "
            "SandboxConfig(allow_unisolated=True) to run it without isolation")
    with _unisolated_warned_lock:
        if not _unisolated_warned:
            _unisolated_warned = True
            warnings.warn("bubblewrap is not installed: sandboxes run model-written code "
                          "WITHOUT isolation (allow_unisolated=True)", RuntimeWarning,
                          stacklevel=3)
    return "unisolated", None


def _mapped_ids(map_path: str) -> list[tuple[int, int]]:
    try:
        with open(map_path) as handle:
            rows = [line.split() for line in handle if line.strip()]
    except OSError:
        return [(0, 1 << 32)]
    return [(int(inside), int(inside) + int(count)) for inside, _, count in rows]


_taken_uids: set[int] = set()
_taken_uids_lock = threading.Lock()


def _claim_uid() -> int:
    """A random uid (and gid), mapped here, that no other live runtime of ours uses."""
    ranges = []
    for low, high in _mapped_ids("/proc/self/uid_map"):
        for gid_low, gid_high in _mapped_ids("/proc/self/gid_map"):
            start, stop = max(low, gid_low, 1_000_000), min(high, gid_high, 1 << 31)
            if stop - start > 1000:
                ranges.append((start, stop))
    if not ranges:
        raise SandboxStartError("no unused uid range is mapped in this user namespace to run "
                                "sandboxes under (need uids >= 1000000)")
    start, stop = max(ranges, key=lambda item: item[1] - item[0])
    with _taken_uids_lock:
        while True:
            uid = random.randrange(start, stop)
            if uid not in _taken_uids:
                _taken_uids.add(uid)
                return uid


def _release_uid(uid: int | None) -> None:
    with _taken_uids_lock:
        _taken_uids.discard(uid)


def _python_roots() -> list[str]:
    """Directories the sandboxed interpreter needs, outermost first, without duplicates."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    candidates += [os.path.realpath(path) for path in candidates]
    roots: list[str] = []
    for path in sorted(set(map(os.path.normpath, candidates)), key=len):
        if path in ("/", "/usr") or not os.path.isdir(path):
            continue
        if not any(path == root or path.startswith(root + "/") for root in roots + ["/usr"]):
            roots.append(path)
    return roots


def _bind_with_parents(args: list[str], source: str, target: str, made: set[str]) -> None:
    parents = []
    parent = os.path.dirname(target)
    while parent not in ("/", ""):
        parents.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(parents):
        if directory not in made:
            made.add(directory)
            args += ["--perms", "0755", "--dir", directory]
    args += ["--ro-bind", source, target]


def _matplotlib_font_cache() -> str | None:
    """A directory holding matplotlib's font list, built once per user and matplotlib version
    and shared by all runtimes, which copy it instead of scanning fonts at every start
    (about a fifth of a runtime's start). None where it cannot be built."""
    global _font_cache
    with _font_cache_lock:
        if _font_cache is not False:
            return _font_cache
        _font_cache = None
        try:
            version = importlib.metadata.version("matplotlib")
        except importlib.metadata.PackageNotFoundError:
            return None
        target = Path(tempfile.gettempdir()) / f"pyvision_sandbox_mpl_{os.geteuid()}_{version}"
        if not _is_private_font_cache(target):
            building = Path(tempfile.mkdtemp(prefix="pyvision_sandbox_mpl_build_"))
            try:
                subprocess.run([sys.executable, "-I", "-c", "import matplotlib.font_manager"],
                               env={"MPLCONFIGDIR": str(building), "PATH": "/usr/bin:/bin"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=300, check=True)
                for path in building.iterdir():
                    path.chmod(0o644)
                building.chmod(0o755)
                building.rename(target)
            except (OSError, subprocess.SubprocessError):
                pass
            finally:
                shutil.rmtree(building, ignore_errors=True)
        if _is_private_font_cache(target):
            _font_cache = str(target)
        return _font_cache


def _is_private_font_cache(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & 0o022 and any(path.glob("fontlist-*.json")))


_font_cache: str | None | bool = False
_font_cache_lock = threading.Lock()


# Linux syscall numbers and audit arch per machine, for the seccomp filter below.
_SECCOMP_ARCHES = {
    "x86_64": {"arch": 0xC000003E, "unshare": 272, "clone": 56, "clone3": 435, "setns": 308},
    "aarch64": {"arch": 0xC00000B7, "unshare": 97, "clone": 220, "clone3": 435, "setns": 268},
}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000


def _seccomp_program() -> bytes | None:
    """A classic-BPF seccomp filter that stops sandboxed code from creating user namespaces
    (the way to regain capabilities, and a large kernel attack surface) and from using other
    syscall ABIs; None on machines it does not know. clone3 answers ENOSYS so that libc falls
    back to clone, whose flags the filter can inspect."""
    numbers = _SECCOMP_ARCHES.get(platform.machine())
    if numbers is None:
        return None
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno_base = 0x7FFF0000, 0x00050000
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved below.
    program = [
        (load, None, None, 4),
        (jeq, None, "enosys", numbers["arch"]),
        (load, None, None, 0),
        (jge, "enosys", None, _X32_SYSCALL_BIT),
        (jeq, "enosys", None, numbers["clone3"]),
        (jeq, "flags", None, numbers["unshare"]),
        (jeq, "flags", None, numbers["clone"]),
        (jeq, "eperm", None, numbers["setns"]),
        (ret, None, None, allow),
        ("flags", None, None, None),
        (load, None, None, 16),
        (jset, "eperm", None, _CLONE_NEWUSER),
        (ret, None, None, allow),
        ("eperm", None, None, None),
        (ret, None, None, errno_base | errno.EPERM),
        ("enosys", None, None, None),
        (ret, None, None, errno_base | errno.ENOSYS),
    ]
    labels, instructions = {}, []
    for entry in program:
        if isinstance(entry[0], str):
            labels[entry[0]] = len(instructions)
        else:
            instructions.append(entry)
    encoded = []
    for index, (code, if_true, if_false, k) in enumerate(instructions):
        jump_true = labels[if_true] - index - 1 if if_true else 0
        jump_false = labels[if_false] - index - 1 if if_false else 0
        encoded.append(struct.pack("<HBBI", code, jump_true, jump_false, k))
    return b"".join(encoded)


def _bwrap_command(bwrap: str, config: SandboxConfig, mode: str, media_dir: str,
                   info_fd: int, font_cache: str | None, seccomp_fd: int | None) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if mode == "root":
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    args += ["--hostname", "sandbox", "--clearenv", "--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    for name, value in _runtime_environment(_SANDBOX_WORKDIR).items():
        args += ["--setenv", name, value]
    # The private /tmp comes before the binds: a Python installation that lives under /tmp
    # (a checkout there) is then bound on top of it instead of being hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(config.tmpfs_bytes // 4), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", str(config.tmpfs_bytes), "--tmpfs", _SANDBOX_WORKDIR]
    args += ["--ro-bind", "/usr", "/usr"]
    made: set[str] = {"/usr", "/dev", "/proc", _SANDBOX_WORKDIR}
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_FILES:
        if os.path.exists(path):
            _bind_with_parents(args, path, path, made)
    for root in _python_roots():
        _bind_with_parents(args, root, root, made)
    _bind_with_parents(args, str(RUNTIME_FILE), f"{_SANDBOX_ROOT}/{RUNTIME_FILE.name}", made)
    _bind_with_parents(args, media_dir, _SANDBOX_MEDIA, made)
    if font_cache is not None:
        _bind_with_parents(args, font_cache, _SANDBOX_FONT_CACHE, made)
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", _SANDBOX_WORKDIR]
    return args


def _runtime_environment(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
        "LANG": "C.UTF-8", "MPLCONFIGDIR": f"{workdir}/.matplotlib",
        "XDG_CACHE_HOME": f"{workdir}/.cache", "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }


def _runtime_settings(config: SandboxConfig, mode: str, request_fd: int, reply_fd: int,
                      workdir: str, uid: int | None, font_cache: str | None) -> dict[str, Any]:
    limits = {"RLIMIT_AS": config.memory_bytes, "RLIMIT_FSIZE": config.max_file_bytes,
              "RLIMIT_CPU": config.cpu_seconds, "RLIMIT_CORE": 0,
              "RLIMIT_NOFILE": config.max_open_files}
    if mode != "unisolated":  # RLIMIT_NPROC counts per real uid: only meaningful isolated
        limits["RLIMIT_NPROC"] = config.max_processes
    return {"request_fd": request_fd, "reply_fd": reply_fd, "limits": limits, "uid": uid,
            "gid": uid, "workdir": workdir, "font_cache": font_cache,
            "max_stdout_bytes": config.max_stdout_bytes,
            "max_image_pixels": config.max_image_pixels,
            "max_aspect_ratio": config.max_aspect_ratio,
            "max_images_per_call": config.max_images_per_call}


def _describe_exit(status: int | None, config: SandboxConfig) -> str:
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
            hint = (f" (the CPU-time limit of {config.cpu_seconds} s or the memory limit may "
                    f"have been reached)")
        return f"was killed by {name}{hint}"
    return f"exited with status {status}"


class _Launcher:
    """Starts launcher processes from one thread that lives as long as the owner process.

    bubblewrap's --die-with-parent kills the sandbox when the *thread* that started it exits,
    so sandboxes started from short-lived threads (pool workers, restarts) must not be
    started there; in exchange, every sandbox dies with its owner, even on SIGKILL.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._owner_pid: int | None = None

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._owner_pid != os.getpid():  # first use, or a forked copy of the owner
                self._owner_pid = os.getpid()
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._queue,),
                                 name="sandbox-launcher", daemon=True).start()
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put((future, argv, kwargs))
        return future.result()

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            future, argv, kwargs = requests.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(subprocess.Popen(argv, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                    future.set_exception(exc)


_launcher = _Launcher()


class _RuntimeProcess:
    """One started runtime: its process, its channel, and how to kill it."""

    def __init__(self, config: SandboxConfig, mode: str, bwrap: str | None, host_dir: Path,
                 cancelled: Any):
        self.config = config
        self._cancelled = cancelled
        self._starting = True
        self.mode = mode
        self.uid = _claim_uid() if mode == "root" else None
        self._seq = 0
        self._kill_lock = threading.RLock()
        self._killed = False
        self._pidfd: int | None = None
        self._info_fd: int | None = None
        self.inner_pid: int | None = None
        media_dir = str(host_dir / "media")
        request_read, self._request_fd = os.pipe()
        self._reply_fd, reply_write = os.pipe()
        child_fds = [request_read, reply_write]
        info_read = info_write = None
        font_cache = _matplotlib_font_cache()
        if mode == "unisolated":
            workdir = str(host_dir / "work")
            argv = [sys.executable, "-I", "-B", str(RUNTIME_FILE)]
            env = _runtime_environment(workdir)
            self.media_root = media_dir
        else:
            workdir = _SANDBOX_WORKDIR
            info_read, info_write = os.pipe()
            child_fds.append(info_write)
            seccomp_read = None
            program = _seccomp_program()
            if program is not None:
                seccomp_read, seccomp_write = os.pipe()
                os.write(seccomp_write, program)
                os.close(seccomp_write)
                child_fds.append(seccomp_read)
            argv = _bwrap_command(bwrap, config, mode, media_dir, info_write, font_cache,
                                  seccomp_read)
            argv += [sys.executable, "-I", "-B", f"{_SANDBOX_ROOT}/{RUNTIME_FILE.name}"]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            self.media_root = _SANDBOX_MEDIA
            font_cache = font_cache and _SANDBOX_FONT_CACHE
        settings = _runtime_settings(config, mode, request_read, reply_write, workdir, self.uid,
                                     font_cache)
        argv.append(json.dumps(settings))
        log_path = host_dir / "launcher.log"
        try:
            with open(log_path, "wb") as log:
                self.process = _launcher.popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    pass_fds=child_fds, start_new_session=True, env=env,
                    cwd=workdir if mode == "unisolated" else "/")
        except BaseException:
            _release_uid(self.uid)
            for fd in child_fds + [self._request_fd, self._reply_fd, info_read]:
                if fd is not None:
                    os.close(fd)
            raise
        for fd in child_fds:
            os.close(fd)
        self._info_fd = info_read
        os.set_blocking(self._request_fd, False)
        os.set_blocking(self._reply_fd, False)
        try:
            deadline = time.monotonic() + config.startup_timeout_s
            if info_read is not None:
                self.inner_pid = json.loads(self._read_info(info_read, deadline))["child-pid"]
                os.close(info_read)
                self._info_fd = None
            else:
                self.inner_pid = self.process.pid
            self._open_pidfd()
            ready, _ = self._receive(deadline)
            if ready.get("op") != _READY_OP or ready.get("seq") != 0:
                raise _ProtocolError(f"unexpected first frame {ready!r}")
            if ready.get("error"):
                raise SandboxStartError(f"sandbox runtime failed to start:\n{ready['error']}")
            self._starting = False
        except BaseException as exc:
            self.kill()
            if isinstance(exc, SandboxStartError):
                raise
            log_text = log_path.read_bytes()[-4000:].decode("utf-8", "replace").strip()
            raise SandboxStartError(
                f"sandbox runtime did not start ({type(exc).__name__}: {exc}); "
                f"launcher output: {log_text or '(none)'}") from exc

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_info(self, fd: int, deadline: float) -> bytes:
        """bubblewrap's JSON status; the pipe stays open until kill(), so that bubblewrap can
        never die writing it before it has released its child."""
        data = b""
        while True:
            self._wait_readable(fd, deadline)
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk

    def _open_pidfd(self) -> None:
        try:
            self._pidfd = os.pidfd_open(self.inner_pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def _wait_readable(self, fd: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _CallTimeout()
            if self._starting and self._cancelled():
                raise SandboxStartError("the start was cancelled")
            if poller.poll(max(1, min(100, int(remaining * 1000)))):
                return

    def _read_exact(self, size: int, deadline: float) -> bytes:
        buffer = bytearray()
        while len(buffer) < size:
            try:
                chunk = os.read(self._reply_fd, min(size - len(buffer), 1 << 22))
            except BlockingIOError:
                self._wait_readable(self._reply_fd, deadline)
                continue
            if not chunk:
                raise _ChannelClosed()
            buffer += chunk
        return bytes(buffer)

    def _max_blob_bytes(self) -> int:
        return self.config.max_images_per_call * (4 * self.config.max_image_pixels + (1 << 20))

    def _receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        magic, json_size, blob_size = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
        if magic != _MAGIC:
            raise _ProtocolError("reply frame has a bad magic number")
        max_json = 4 * self.config.max_stdout_bytes + (1 << 20)
        if json_size > max_json or blob_size > self._max_blob_bytes():
            raise _ProtocolError(f"reply frame too large ({json_size} + {blob_size} bytes)")
        try:
            message = json.loads(self._read_exact(json_size, deadline))
        except ValueError as exc:
            raise _ProtocolError(f"reply is not valid JSON: {exc}") from exc
        if not isinstance(message, dict):
            raise _ProtocolError("reply is not a JSON object")
        return message, self._read_exact(blob_size, deadline)

    def _send(self, message: dict[str, Any], deadline: float) -> None:
        payload = json.dumps(message).encode("utf-8")
        view = memoryview(_HEADER.pack(_MAGIC, len(payload), 0) + payload)
        poller = select.poll()
        poller.register(self._request_fd, select.POLLOUT)
        while view:
            try:
                view = view[os.write(self._request_fd, view):]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _CallTimeout() from None
                poller.poll(max(1, int(remaining * 1000)))
            except (BrokenPipeError, OSError) as exc:
                raise _ChannelClosed() from exc

    def call(self, message: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Sends one request and returns its reply; raises _CallTimeout, _ChannelClosed or
        _ProtocolError (after which the runtime must be killed)."""
        if self._killed:
            raise _ChannelClosed()
        self._seq += 1
        deadline = time.monotonic() + timeout_s
        self._send(dict(message, seq=self._seq), deadline)
        reply, blob = self._receive(deadline)
        if reply.get("op") != _REPLY_OP or reply.get("seq") != self._seq:
            raise _ProtocolError(f"reply answers request {reply.get('seq')!r}, "
                                 f"not {self._seq}")
        sizes = reply.get("image_sizes")
        if (not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes)
                or sum(sizes) != len(blob)
                or len(sizes) > self.config.max_images_per_call):
            raise _ProtocolError("reply image sizes do not match its payload")
        return reply, blob

    def exit_status(self, wait_s: float) -> int | None:
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Kills the runtime and everything in its namespace, and reaps the launcher.

        The launcher's own children go first: bubblewrap's first child waits to be released by
        its parent after it is cloned, and killing only the parent would strand it.
        """
        with self._kill_lock:
            if self._killed:
                return
            self._killed = True
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
            if self.mode == "unisolated" or not killed_inside or self.exit_status(5.0) is None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.process.wait()
            _release_uid(self.uid)
            for fd in (self._pidfd, self._request_fd, self._reply_fd, self._info_fd):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self._pidfd = self._info_fd = None

    @property
    def killed(self) -> bool:
        return self._killed


_live_sandboxes: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_live_pools: weakref.WeakSet[SandboxPool] = weakref.WeakSet()
_registry_lock = threading.Lock()
_hooks_installed = False


def _close_everything() -> None:
    for pool in list(_live_pools):
        pool.close()
    for sandbox in list(_live_sandboxes):
        sandbox.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    _close_everything()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_shutdown_hooks() -> None:
    """Closes all sandboxes at exit and on SIGTERM (when SIGTERM has no other handler)."""
    global _hooks_installed
    with _registry_lock:
        if _hooks_installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        _hooks_installed = True
    atexit.register(_close_everything)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


_HOST_DIR_PREFIX = "pyvision_sandbox_"
_OWNER_LOCK = "owner.lock"
_swept = False


def _lock_host_dir(host_dir: Path) -> int:
    """Holds an exclusive lock on the sandbox's host directory for as long as its owner lives
    (the kernel drops it when the owner dies, however it dies). The lock file is locked before
    it gets its final name, so a sweeper never sees it unlocked while its owner is alive."""
    fd, path = tempfile.mkstemp(dir=host_dir)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(path, host_dir / _OWNER_LOCK)
    return fd


def _sweep_abandoned_host_dirs() -> None:
    """Removes host directories (copied media) left by owners that died without cleaning up;
    runs once per process."""
    global _swept
    with _registry_lock:
        if _swept:
            return
        _swept = True
    for directory in Path(tempfile.gettempdir()).glob(_HOST_DIR_PREFIX + "*"):
        lock_path = directory / _OWNER_LOCK
        try:
            if directory.lstat().st_uid != os.geteuid():
                continue
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # not a sandbox directory, another user's, or one being created
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


def _check_variable_name(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"sandbox variable name must be a Python identifier, got {name!r}")


class Sandbox:
    """An isolated Python runtime whose variables persist across `run` calls."""

    def __init__(self, config: SandboxConfig | None = None, *,
                 cancel: threading.Event | None = None):
        """Starts the runtime (blocking); setting `cancel` abandons a start in progress."""
        self.config = config or SandboxConfig()
        self._mode, self._bwrap = _isolation_mode(self.config)
        self._cancel = cancel
        self._closing = threading.Event()
        _install_shutdown_hooks()
        self._lock = threading.Lock()
        self._state_lock = threading.RLock()
        self._closed = False
        self._state_lost = False
        self._preloads: list[dict[str, str]] = []
        self._restart_thread: threading.Thread | None = None
        self._restarted: _RuntimeProcess | BaseException | None = None
        _sweep_abandoned_host_dirs()
        self._host_dir = Path(tempfile.mkdtemp(prefix=_HOST_DIR_PREFIX))
        self._owner_lock = _lock_host_dir(self._host_dir)
        try:
            (self._host_dir / "media").mkdir(mode=0o755)
            (self._host_dir / "media").chmod(0o755)
            if self._mode == "unisolated":
                (self._host_dir / "work").mkdir(mode=0o700)
            self._runtime: _RuntimeProcess | None = self._start_runtime()
        except BaseException:
            self._release_resources()
            raise
        with _registry_lock:
            _live_sandboxes.add(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """Host pid of the current runtime's outermost process (bwrap), for monitoring."""
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
        return runtime is not None and not runtime.killed and runtime.process.poll() is None

    @property
    def isolated(self) -> bool:
        return self._mode != "unisolated"

    def _start_runtime(self) -> _RuntimeProcess:
        runtime = _RuntimeProcess(self.config, self._mode, self._bwrap, self._host_dir,
                                  self._start_cancelled)
        try:
            for request in self._preloads:
                self._call_preload(runtime, request)
        except BaseException:
            runtime.kill()
            raise
        return runtime

    def _start_cancelled(self) -> bool:
        return self._closing.is_set() or (self._cancel is not None and self._cancel.is_set())

    def _call_preload(self, runtime: _RuntimeProcess, request: dict[str, str]) -> None:
        message = dict(request, path=f"{runtime.media_root}/{request['file']}")
        try:
            reply, _ = runtime.call(message, self.config.preload_timeout_s)
        except (_CallTimeout, _ChannelClosed, _ProtocolError) as exc:
            runtime.kill()
            raise SandboxError(f"{request['op']} of {request['name']!r} failed: the runtime "
                               f"{type(exc).__name__.strip('_')}") from exc
        if reply.get("error"):
            raise SandboxError(f"{request['op']} of {request['name']!r} failed: "
                               f"{reply['error']}")

    def _restart_in_background(self) -> None:
        try:
            runtime: _RuntimeProcess | BaseException = self._start_runtime()
        except BaseException as exc:  # noqa: BLE001 - handed to the next call
            runtime = exc
        with self._state_lock:
            self._restarted = runtime
            closed = self._closed
        if closed and isinstance(runtime, _RuntimeProcess):
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
                    target=self._restart_in_background, name="sandbox-restart", daemon=True)
                self._restart_thread.start()

    def _ready_runtime(self) -> _RuntimeProcess:
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
        if isinstance(restarted, _RuntimeProcess):
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
            try:
                reply, blob = runtime.call({"op": "run", "code": code}, self.config.timeout_s)
            except _CallTimeout:
                self._discard_runtime()
                return RunResult(
                    stdout=notice, images=[], timed_out=True, state_lost=state_lost,
                    wall_time_s=time.monotonic() - start,
                    error=(f"TimeoutError: the code did not finish within "
                           f"{self.config.timeout_s:g} s and was stopped; the Python session "
                           f"was restarted and its variables are lost"))
            except (_ChannelClosed, _ProtocolError) as exc:
                status = runtime.exit_status(1.0) if isinstance(exc, _ChannelClosed) else None
                self._discard_runtime()
                if self._closed:
                    reason = "the sandbox was closed during the call"
                elif isinstance(exc, _ProtocolError):
                    reason = f"the runtime broke its reply channel ({exc})"
                else:
                    reason = f"the Python process {_describe_exit(status, self.config)}"
                return RunResult(
                    stdout=notice, images=[], timed_out=False, state_lost=state_lost,
                    wall_time_s=time.monotonic() - start,
                    error=(f"SandboxCrash: {reason}; the Python session was restarted and "
                           f"its variables are lost"))
            wall_time_s = time.monotonic() - start
            try:
                images = self._decode_images(reply, blob)
                stdout = self._stdout_text(reply)
            except _ProtocolError as exc:
                self._discard_runtime()
                return RunResult(stdout=notice, images=[], timed_out=False,
                                 state_lost=state_lost, wall_time_s=wall_time_s,
                                 error=f"SandboxCrash: {exc}; the Python session was "
                                       f"restarted and its variables are lost")
            return RunResult(stdout=notice + stdout, images=images,
                             error=self._error_text(reply), timed_out=False,
                             wall_time_s=wall_time_s, state_lost=state_lost)

    def _stdout_text(self, reply: dict[str, Any]) -> str:
        stdout, dropped = reply.get("stdout"), reply.get("stdout_dropped_bytes")
        if not isinstance(stdout, str) or not isinstance(dropped, int) or dropped < 0:
            raise _ProtocolError("reply has a malformed stdout")
        encoded = stdout.encode("utf-8", "replace")
        limit = self.config.max_stdout_bytes
        if len(encoded) > limit:
            dropped += len(encoded) - limit
            stdout = encoded[:limit].decode("utf-8", "replace")
        if dropped:
            stdout += TRUNCATION_MARKER.format(dropped=dropped)
        return stdout

    @staticmethod
    def _error_text(reply: dict[str, Any]) -> str | None:
        parts = []
        if isinstance(reply.get("error"), str) and reply["error"]:
            parts.append(reply["error"])
        notes = reply.get("notes")
        if isinstance(notes, list):
            parts += [str(note) for note in notes]
        return "\n".join(parts) or None

    def _decode_images(self, reply: dict[str, Any], blob: bytes) -> list[Image.Image]:
        import io

        images, offset = [], 0
        for size in reply["image_sizes"]:
            data = blob[offset:offset + size]
            offset += size
            try:
                with Image.open(io.BytesIO(data)) as image:
                    if image.format != "PNG":
                        raise _ProtocolError("an image is not a PNG")
                    width, height = image.size
                    if (width * height > self.config.max_image_pixels
                            or max(width, height) >= self.config.max_aspect_ratio
                            * min(width, height)):
                        raise _ProtocolError(f"an image of {width}x{height} passed the limits")
                    image.load()
                    images.append(image.copy())
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                raise _ProtocolError(f"an image could not be decoded ({exc})") from exc
        return images

    def _stage_media(self, name: str, source: Image.Image | str | Path, suffix: str) -> str:
        media_dir = self._host_dir / "media"
        if isinstance(source, Image.Image):
            filename = f"{name}.png"
            source.save(media_dir / filename, format="PNG", compress_level=1)
        else:
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"media file for {name!r} not found: {path}")
            filename = f"{name}{path.suffix or suffix}"
            target = media_dir / filename
            target.unlink(missing_ok=True)
            try:
                if path.stat().st_mode & 0o004 == 0:
                    raise OSError("not world-readable: copy it")
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
        (media_dir / filename).chmod(0o644)
        return filename

    def _preload(self, op: str, name: str, source: Image.Image | str | Path,
                 suffix: str) -> None:
        _check_variable_name(name)
        with self._lock:
            runtime = self._ready_runtime()
            request = {"op": op, "name": name, "file": self._stage_media(name, source, suffix)}
            try:
                self._call_preload(runtime, request)
            finally:
                if runtime.killed:
                    self._discard_runtime()
            self._preloads = [r for r in self._preloads if r["name"] != name] + [request]

    def preload_image(self, name: str, image: Image.Image | str | Path) -> None:
        """Defines `name` in the runtime as the full-resolution RGB PIL image."""
        if not isinstance(image, (Image.Image, str, Path)):
            raise TypeError(f"preload_image({name!r}) expects a PIL image or a path, got "
                            f"{type(image).__name__}")
        self._preload("load_image", name, image, ".png")

    def preload_video(self, name: str, path: str | Path) -> None:
        """Defines `name` as a decord.VideoReader (and `VideoReader`, `cpu`) in the runtime."""
        if not isinstance(path, (str, Path)):
            raise TypeError(f"preload_video({name!r}) expects a path, got {type(path).__name__}")
        self._preload("load_video", name, path, ".mp4")

    def _release_resources(self) -> None:
        shutil.rmtree(self._host_dir, ignore_errors=True)
        os.close(self._owner_lock)

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
        if isinstance(restarted, _RuntimeProcess):
            restarted.kill()
        self._release_resources()
        with _registry_lock:
            _live_sandboxes.discard(self)


class SandboxPool:
    """Keeps `size` sandboxes started (imports done) so that `acquire` is fast.

    A released sandbox is destroyed in the background, never handed out again. Thread-safe.
    """

    def __init__(self, config: SandboxConfig | None = None, size: int = 4,
                 start_workers: int | None = None):
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size!r}")
        self.config = config or SandboxConfig()
        self.size = size
        _isolation_mode(self.config)
        _install_shutdown_hooks()
        self._cond = threading.Condition(threading.RLock())
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._leased: set[Sandbox] = set()
        self._retired: collections.deque[Sandbox] = collections.deque()
        self._starting = 0
        self._closed = False
        self._closing = threading.Event()
        self._start_error: BaseException | None = None
        workers = start_workers or max(1, min(size, os.cpu_count() or 1))
        self._workers = [threading.Thread(target=self._maintain, name=f"sandbox-pool-{i}",
                                          daemon=True) for i in range(workers)]
        with _registry_lock:
            _live_pools.add(self)
        for worker in self._workers:
            worker.start()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def idle_count(self) -> int:
        with self._cond:
            return len(self._idle)

    def _maintain(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._retired and (
                        len(self._idle) + self._starting >= self.size):
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
                sandbox = Sandbox(self.config, cancel=self._closing)
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
                    raise SandboxStartError(f"the pool cannot start sandboxes: "
                                            f"{self._start_error}") from self._start_error
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
        with _registry_lock:
            _live_pools.discard(self)
