"""The persistent Python session of a runtime: runs each request's code in one namespace and
collects what it printed and showed."""

from __future__ import annotations

import builtins
import io
import linecache
import os
import sys
import traceback
import types
from typing import Any

from .capture import (
    CAPTURE_READ_FD,
    CAPTURE_WRITE_FD,
    CaptureStream,
    DescriptorDrain,
    OutputCapture,
)
from .images import ImageCollector, LazyModule, install_matplotlib_backend, make_display

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring

MAX_ERROR_CHARS = 4000

_os_exit = os._exit
_os_getpid = os.getpid
_os_dup2 = os.dup2


def error_text(exc: BaseException, skip_frames: int) -> str:
    """The traceback of `exc` without its first `skip_frames` frames, keeping the tail."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    else:
        lines = traceback.format_exception(type(exc), exc, tb)
    text = "".join(lines).rstrip()
    if len(text) > MAX_ERROR_CHARS:
        text = "...\n" + text[-MAX_ERROR_CHARS:]
    return text


class Session:
    """Executes requests in one persistent namespace."""

    def __init__(self, settings: dict[str, Any]):
        self.pid = _os_getpid()
        self.calls = 0
        self.capture = OutputCapture(settings["max_stdout_bytes"])
        self.stream = CaptureStream(self.capture, 1)
        self.collector = ImageCollector(
            settings["max_image_pixels"], settings["max_aspect_ratio"], settings["max_images_per_call"]
        )
        self.drain = DescriptorDrain(self.capture, CAPTURE_READ_FD)
        self.namespace = self._prepare_namespace()
        self._builtins_snapshot = dict(vars(builtins))
        self._modules_snapshot = dict(sys.modules)

    def heal(self) -> None:
        """Puts back builtins and modules that user code replaced or deleted (names it added
        stay), so the runtime's own standard-library calls and later calls keep working."""
        vars(builtins).update(self._builtins_snapshot)
        sys.modules.update(self._modules_snapshot)

    def _prepare_namespace(self) -> dict[str, Any]:
        import base64
        import math

        import numpy as np
        import PIL
        from PIL import Image

        install_matplotlib_backend(self.collector)
        matplotlib, plt = LazyModule("matplotlib"), LazyModule("matplotlib.pyplot")
        Image.preinit()
        display = make_display(self.collector)
        Image.Image.show = lambda image, title=None: display(image)

        main_module = types.ModuleType("__main__")
        namespace = main_module.__dict__
        namespace.update(
            __builtins__=builtins,
            np=np,
            PIL=PIL,
            Image=Image,
            matplotlib=matplotlib,
            plt=plt,
            io=io,
            base64=base64,
            math=math,
            display=display,
        )
        sys.modules["__main__"] = main_module
        return namespace

    def redirect_output(self) -> None:
        _os_dup2(CAPTURE_WRITE_FD, 1)
        _os_dup2(CAPTURE_WRITE_FD, 2)
        sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = self.stream

    def _begin(self) -> None:
        self.capture.reset()
        self.collector.reset()
        self.redirect_output()

    def exit_if_forked(self) -> None:
        """Ends a process forked by user code: it must never answer the host."""
        if _os_getpid() != self.pid:
            _os_exit(0)

    def _finish(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        self.exit_if_forked()
        self.redirect_output()
        self.drain.sync()
        stdout, dropped = self.capture.take()
        notes = self.collector.summary_notes()
        images = self.collector.encoded
        self.collector.reset()
        message.update(
            stdout=stdout, stdout_dropped_bytes=dropped, notes=notes, image_sizes=[len(image) for image in images]
        )
        return message, images

    def run_code(self, code: str) -> tuple[dict[str, Any], list[bytes]]:
        self.calls += 1
        filename = f"<code {self.calls}>"
        lines = code.splitlines(keepends=True)
        linecache.cache[filename] = (len(code), None, lines, filename)
        raised = None
        self._begin()
        try:
            compiled = compile(code, filename, "exec", dont_inherit=True)
            exec(compiled, self.namespace)
        except BaseException as exc:  # noqa: BLE001 - everything user code raises is reported
            raised = exc
        self.heal()  # before formatting: the traceback module relies on intact builtins
        error = None if raised is None else error_text(raised, skip_frames=1)
        raised = None  # frees the frames (and their big locals) the traceback holds
        return self._finish({"error": error})

    def load_image(self, name: str, path: str) -> tuple[dict[str, Any], list[bytes]]:
        from PIL import Image

        self._begin()
        with Image.open(path) as image:
            self.namespace[name] = image.convert("RGB")
        return self._finish({"error": None})

    def load_video(self, name: str, path: str) -> tuple[dict[str, Any], list[bytes]]:
        from decord import VideoReader, cpu

        self._begin()
        self.namespace.update({name: VideoReader(path, ctx=cpu(0)), "VideoReader": VideoReader, "cpu": cpu})
        return self._finish({"error": None})

    def load_code(self, name: str, code: str) -> tuple[dict[str, Any], list[bytes]]:
        """Setup code (trusted, from the run's config) executed in the namespace; what it
        prints is dropped and it shows no figure."""
        self._begin()
        try:
            exec(compile(code, f"<setup {name}>", "exec", dont_inherit=True), self.namespace)
        except BaseException as exc:  # noqa: BLE001 - reported to the host, which fails the start
            self.heal()
            return self._finish({"error": error_text(exc, skip_frames=1)})
        self.heal()
        return self._finish({"error": None})

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        op = request.get("op")
        if op == "run":
            return self.run_code(request["code"])
        if op == "load_image":
            return self.load_image(request["name"], request["path"])
        if op == "load_video":
            return self.load_video(request["name"], request["path"])
        if op == "load_code":
            return self.load_code(request["name"], request["code"])
        raise ValueError(f"unknown request op {op!r}")
