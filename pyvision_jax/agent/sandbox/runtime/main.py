"""The runtime's start and request loop: move the channel out of reach, set the limits, drop
privileges, start the session, then answer requests until the host closes the channel.

`main` runs it in a process of its own (started by bubblewrap); `run` in a fork of the
template, which passes the settings of the fork's request."""

from __future__ import annotations

import builtins
import json
import os
import resource
import shutil
import sys
import threading

from .capture import CAPTURE_READ_FD, CAPTURE_WRITE_FD
from .channel import REPLY_FD, REQUEST_FD, read_frame, watch_host, write_frame
from .namespaces import clear_capabilities, drop_bounding_capabilities
from .protocol import READY_OP, REPLY_OP
from .session import Session, error_text

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring


def _set_limits(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        kind = getattr(resource, name)
        resource.setrlimit(kind, (value, value))


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def seed_font_cache(source: str | None) -> None:
    """Copies matplotlib's font list built by the host, so that import skips the font scan
    (only the directory is made where matplotlib's fonts are loaded already)."""
    target = os.environ.get("MPLCONFIGDIR")
    try:
        os.makedirs(target, exist_ok=True)
        if not source or "matplotlib.font_manager" in sys.modules:
            return
        for name in os.listdir(source):
            if name.startswith("fontlist-") and name.endswith(".json"):
                shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
    except (OSError, TypeError):
        pass  # matplotlib then builds its own


def _move_descriptor(fd: int, target: int) -> None:
    if fd != target:
        os.dup2(fd, target, inheritable=False)
        os.close(fd)
    else:
        os.set_inheritable(fd, False)


def main(argv: list[str]) -> int:
    """Runs the runtime described by the JSON settings in argv[1]; returns the exit status."""
    return run(json.loads(argv[1]))


def run(settings: dict) -> int:
    """Runs the runtime described by `settings`; returns the exit status.

    With `drop_capabilities` (a fork of the template, which holds capabilities to build its
    namespaces) the bounding set is emptied first and no capability is left at the end."""
    _move_descriptor(settings["request_fd"], REQUEST_FD)
    _move_descriptor(settings["reply_fd"], REPLY_FD)
    _set_limits(settings["limits"])
    if settings.get("drop_capabilities"):
        drop_bounding_capabilities()
    if settings.get("uid") is not None:
        _drop_privileges(settings["uid"], settings["gid"])
    if settings.get("drop_capabilities"):
        clear_capabilities()
    os.chdir(settings["workdir"])
    seed_font_cache(settings.get("font_cache"))

    capture_read, capture_write = os.pipe()
    _move_descriptor(capture_read, CAPTURE_READ_FD)
    _move_descriptor(capture_write, CAPTURE_WRITE_FD)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    threading.Thread(target=watch_host, args=(REQUEST_FD,), daemon=True).start()
    try:
        session = Session(settings)
    except BaseException as exc:  # noqa: BLE001 - reported to the host, then exit
        write_frame(REPLY_FD, {"op": READY_OP, "seq": 0, "error": error_text(exc, 0)})
        return 1
    session.redirect_output()
    threading.Thread(target=session.drain.run_forever, daemon=True).start()
    write_frame(REPLY_FD, {"op": READY_OP, "seq": 0, "error": None})

    while True:
        try:
            request = read_frame(REQUEST_FD)
        except EOFError:
            return 0
        seq = request.get("seq")
        try:
            message, images = session.handle(request)
        except BaseException as exc:  # noqa: BLE001 - runtime-side failure, reported
            session.exit_if_forked()
            message, images = {"error": "sandbox runtime error: " + error_text(exc, 0)}, []
            message.update(stdout="", stdout_dropped_bytes=0, notes=[], image_sizes=[])
        message.update(op=REPLY_OP, seq=seq)
        write_frame(REPLY_FD, message, images)
