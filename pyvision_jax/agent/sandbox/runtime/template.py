"""The template of a pool's runtimes: imports the runtime's libraries once, inside bubblewrap,
then forks one runtime per request from the host.

Each request arrives on the control socket (a SOCK_SEQPACKET socket) as one JSON message with
the runtime's three pipe ends attached: its request pipe, its reply pipe and a status pipe. A
runtime is three processes deep:

- the intermediate: a fork of the template that closes every other descriptor and enters new
  namespaces (mount, PID, IPC, network, UTS, cgroup; and a user namespace of its own where the
  template runs in bubblewrap's). A new PID namespace applies to the children of the process
  that makes it, so it forks the init, sends its pidfd to the template and exits.
- the init (PID 1 of the new namespace): mounts a /proc of that namespace, fresh tmpfs at the
  work dir and /dev/shm, its own devpts, the sandbox's media at /media and an empty tmpfs over
  the template's directory of all sandboxes; sets its loopback up; installs the seccomp
  filter; forks the runtime; then drops every capability, makes itself untraceable, lets the
  runtime go on, and reaps: when the runtime ends it writes its exit status to the status
  pipe and exits, which ends everything left in the namespace. A start that fails before the
  runtime exists is reported on the reply pipe.
- the runtime (PID 2): waits for its init's go, sets its limits, empties its capabilities (and
  takes its own uid where the template runs as root), then runs the ordinary request loop of
  `main`.

The template answers each request with the init's pidfd and the CPU seconds the fork cost the
template and the intermediate. It exits when the host closes the control socket; every
runtime lives inside the template's bubblewrap and dies with it.
"""

from __future__ import annotations

import base64
import gc
import importlib
import json
import os
import re
import signal
import socket
import sys
import time
from typing import Any

from . import main as runtime_main
from .channel import write_frame
from .images import BACKEND_MODULE
from .namespaces import (
    CLONE_NEWUSER,
    RUNTIME_NAMESPACES,
    bring_loopback_up,
    clear_capabilities,
    drop_bounding_capabilities,
    install_seccomp,
    make_undumpable,
    map_own_ids,
    mount_private_views,
    unshare,
)
from .protocol import READY_OP

PRELOADED_MODULES = (
    "numpy",
    "numpy.random",
    "PIL.Image",
    "matplotlib",
    "matplotlib.pyplot",
    "matplotlib.backends.backend_agg",
    "decord",
    "scipy.ndimage",
)
_SANDBOX_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # one directory, never ".."
_MAX_MESSAGE_BYTES = 1 << 20


def _preload_libraries(settings: dict[str, Any]) -> None:
    """Imports what every runtime uses, with matplotlib set to the runtime's capturing backend
    (made by each runtime's session: pyplot only asks for it at the first figure)."""
    os.environ["MPLBACKEND"] = f"module://{BACKEND_MODULE}"
    runtime_main.seed_font_cache(settings.get("font_cache"))
    for name in PRELOADED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a runtime imports it itself when it is used, and reports what is missing
    if "PIL.Image" in sys.modules:
        sys.modules["PIL.Image"].preinit()


def _exit_code(status: int) -> int:
    """An exit status the way bubblewrap reports its child's: the code, or 128 + signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _report_start_failure(reply_fd: int, exc: BaseException) -> None:
    """Answers the host's wait for the runtime's first frame with why it will not come."""
    try:
        write_frame(
            reply_fd,
            {
                "op": READY_OP,
                "seq": 0,
                "error": f"the runtime's namespaces could not be set up ({type(exc).__name__}: {exc})",
            },
        )
    except OSError:
        pass


def _runtime(settings: dict[str, Any], status_fd: int, go_fd: int) -> None:
    """The runtime (PID 2); starts once its init has given up its capabilities (`go_fd`
    then delivers a byte) and never returns."""
    code = 1
    try:
        os.close(status_fd)
        if os.read(go_fd, 1) != b"1":
            return  # the init died: the namespace is ending
        os.close(go_fd)
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()  # a fork would otherwise repeat the template's random stream
        code = runtime_main.run(settings)
    finally:
        os._exit(code)


def _init(template: dict[str, Any], request: dict[str, Any], fds: list[int]) -> None:
    """PID 1 of the runtime's namespaces; never returns."""
    request_fd, reply_fd, status_fd = fds
    code = 125
    try:
        try:
            mount_private_views(
                template["workdir"],
                request["tmpfs_bytes"],
                template["kept_in_workdir"],
                f"{template['hosts_dir']}/{request['sandbox']}/media",
                template["media_dir"],
                [template["hosts_dir"]],
            )
            bring_loopback_up()
            if template.get("seccomp"):
                install_seccomp(base64.b64decode(template["seccomp"]))
            go_read, go_write = os.pipe()
            runtime_pid = os.fork()
        except BaseException as exc:  # noqa: BLE001 - reported to the host, then exit
            _report_start_failure(reply_fd, exc)
            raise
        if runtime_pid == 0:
            os.close(go_write)
            _runtime(
                dict(request["runtime"], request_fd=request_fd, reply_fd=reply_fd, drop_capabilities=True),
                status_fd,
                go_read,
            )
        for fd in (request_fd, reply_fd, go_read):
            os.close(fd)
        for signum in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(signum, signal.SIG_DFL)  # PID 1 ignores what it does not handle
            except (OSError, ValueError):
                pass
        drop_bounding_capabilities()
        clear_capabilities()
        make_undumpable()
        os.write(go_write, b"1")
        os.close(go_write)
        while True:
            pid, status = os.wait()
            if pid == runtime_pid:
                code = _exit_code(status)
                os.write(status_fd, code.to_bytes(4, "little"))
                break
    finally:
        os._exit(code)


def _intermediate(template: dict[str, Any], request: dict[str, Any], fds: list[int], report: socket.socket) -> None:
    """Enters the runtime's namespaces, forks its init and sends the init's pidfd on `report`
    (or why it failed); never returns."""
    code = 1
    try:
        keep = sorted(set(fds) | {0, 1, 2, report.fileno()})
        for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)
        flags = RUNTIME_NAMESPACES
        if template["mode"] == "userns":
            flags |= CLONE_NEWUSER
        uid, gid = os.getuid(), os.getgid()
        try:
            unshare(flags)
            if template["mode"] == "userns":
                map_own_ids(uid, gid)
            init_pid = os.fork()
        except BaseException as exc:  # noqa: BLE001 - reported to the template, then exit
            report.send(
                json.dumps(
                    {"error": f"the runtime's namespaces could not be created ({type(exc).__name__}: {exc})"}
                ).encode()
            )
            raise
        if init_pid == 0:
            report.close()
            _init(template, request, fds)
        socket.send_fds(report, [b"{}"], [os.pidfd_open(init_pid)])
        code = 0
    finally:
        os._exit(code)


def _fork_runtime(
    template: dict[str, Any], request: dict[str, Any], fds: list[int], reports: tuple[socket.socket, socket.socket]
) -> tuple[dict[str, Any], list[int]]:
    """Forks one runtime; (the reply to the host, the descriptors to send with it).
    `reports`: the template's end and the intermediate's end of the socket that carries the
    init's pidfd."""
    if len(fds) != 3 or not _SANDBOX_NAME.fullmatch(str(request.get("sandbox"))):
        return {"error": "malformed fork request"}, []
    cpu_start = time.process_time()
    pid = os.fork()
    if pid == 0:
        _intermediate(template, request, fds, reports[1])
    _, status, usage = os.wait4(pid, 0)
    try:
        message, pidfds, _, _ = socket.recv_fds(reports[0], 65536, 1, socket.MSG_DONTWAIT)
        report = json.loads(message)
    except (BlockingIOError, ValueError):
        report, pidfds = {}, []
    cpu_s = time.process_time() - cpu_start + usage.ru_utime + usage.ru_stime
    if status != 0 or len(pidfds) != 1:
        error = report.get("error") or f"the fork exited with status {_exit_code(status)}"
        return {"error": error}, pidfds
    return {"error": None, "cpu_s": cpu_s}, pidfds


def main(argv: list[str]) -> int:
    """Serves fork requests for the template described by the JSON settings in argv[2]."""
    template = json.loads(argv[2])
    control = socket.socket(fileno=template["control_fd"])
    os.chdir(template["workdir"])
    _preload_libraries(template)
    reports = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.freeze()  # forks then leave the template's objects (and their pages) alone
    control.send(json.dumps({"op": READY_OP}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE_BYTES, 3)
        if not message:
            return 0
        try:
            reply, reply_fds = _fork_runtime(template, json.loads(message), fds, reports)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            socket.send_fds(control, [json.dumps(reply).encode()], reply_fds)
        finally:
            for fd in reply_fds:
                os.close(fd)
