"""The program that runs inside a sandbox and executes model-written code.

`pyvision_jax.agent.sandbox` starts this file as a script (inside bubblewrap); nothing in the
package imports it. It depends only on the standard library until its limits are set and its
privileges dropped, then imports numpy, PIL and matplotlib for the code it runs.

Channel: two inherited pipes carry frames `MAGIC | u32 json length | u64 blob length | json |
blob` (host -> runtime requests, runtime -> host replies). They are moved to high descriptor
numbers so that ordinary file handling in user code cannot clobber them; user code that does
break them only ends its own runtime, which the host reports. Every request carries a sequence
number that the reply repeats.

Output: `print` goes to an in-process capture capped at `max_stdout_bytes` (the rest is only
counted); descriptors 1 and 2 are a pipe drained into the same capture, so C-level writes and
`os.write(1, ...)` are captured and capped too. Figures reach the host through a matplotlib
backend whose `show` renders them; `display(...)` does the same for PIL images and arrays.
"""

import builtins

# The runtime's own functions resolve builtins through this private copy, so user code that
# replaces `builtins.print`, `len`, `__import__`, ... breaks only its own later calls.
globals()["__builtins__"] = dict(vars(builtins))

import io  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402

MAGIC = b"PVSB"
HEADER = struct.Struct("<4sIQ")
MAX_REQUEST_JSON_BYTES = 64 * 1024 * 1024
MAX_ERROR_CHARS = 4000

REQUEST_FD = 1021
REPLY_FD = 1022
CAPTURE_WRITE_FD = 1019
CAPTURE_READ_FD = 1020
MIN_OPEN_FILES = 1024

_os_read = os.read
_os_write = os.write
_os_exit = os._exit
_os_getpid = os.getpid
_os_dup2 = os.dup2
_json_dumps = json.dumps
_json_loads = json.loads
_header_pack = HEADER.pack
_header_unpack = HEADER.unpack
_bytes_join = b"".join


def _read_exact(fd, size):
    chunks = []
    remaining = size
    while remaining:
        chunk = _os_read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("host closed the request channel")
        chunks.append(chunk)
        remaining -= len(chunk)
    return _bytes_join(chunks)


def read_frame(fd):
    magic, json_size, blob_size = _header_unpack(_read_exact(fd, HEADER.size))
    if magic != MAGIC or json_size > MAX_REQUEST_JSON_BYTES or blob_size:
        raise ValueError("malformed request frame")
    return _json_loads(_read_exact(fd, json_size).decode("utf-8"))


def write_frame(fd, message, blobs=()):
    payload = _json_dumps(message, ensure_ascii=False).encode("utf-8")
    blob = _bytes_join(blobs)
    view = memoryview(_bytes_join([_header_pack(MAGIC, len(payload), len(blob)), payload, blob]))
    while view:
        written = _os_write(fd, view)
        view = view[written:]


class OutputCapture:
    """Keeps the first `limit` bytes written during a call and counts the rest."""

    def __init__(self, limit):
        self.limit = limit
        self.lock = threading.Lock()
        self.parts = []
        self.size = 0
        self.dropped = 0

    def reset(self):
        with self.lock:
            self.parts = []
            self.size = 0
            self.dropped = 0

    def add(self, data):
        with self.lock:
            room = self.limit - self.size
            if room > 0:
                kept = data[:room]
                self.parts.append(bytes(kept))
                self.size += len(kept)
                self.dropped += len(data) - len(kept)
            else:
                self.dropped += len(data)

    def take(self):
        with self.lock:
            text = _bytes_join(self.parts).decode("utf-8", "replace")
            dropped = self.dropped
        return text, dropped


class CaptureStream(io.TextIOBase):
    """`sys.stdout` / `sys.stderr` during user code."""

    def __init__(self, capture, fd):
        self._capture = capture
        self._fd = fd

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._capture.add(text.encode("utf-8", "replace"))
        return len(text)

    def flush(self):
        pass


class DescriptorDrain:
    """Moves bytes written to descriptors 1 and 2 into the capture."""

    def __init__(self, capture, fd):
        self._capture = capture
        self._fd = fd
        self._lock = threading.Lock()
        os.set_blocking(fd, False)

    def _drain_available(self):
        while True:
            try:
                data = _os_read(self._fd, 1 << 20)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            self._capture.add(data)

    def run_forever(self):
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while True:
            events = poller.poll()
            with self._lock:
                self._drain_available()
            if any(event & (select.POLLERR | select.POLLNVAL) for _, event in events):
                return  # user code closed the pipe: nothing more can arrive

    def sync(self):
        """Collect everything already written; called at the end of each request."""
        with self._lock:
            try:
                self._drain_available()
            except OSError:
                pass


def _watch_host(fd):
    """Exit as soon as the host side of the request channel is gone (owner died)."""
    poller = select.poll()
    poller.register(fd, 0)
    while True:
        for _, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                _os_exit(0)


class ImageCollector:
    """Checks and encodes the images one call produces."""

    def __init__(self, max_pixels, max_aspect_ratio, max_images):
        import numpy
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        self._np = numpy
        self._image_module = Image
        self._agg_canvas = FigureCanvasAgg
        self.max_pixels = max_pixels
        self.max_aspect_ratio = max_aspect_ratio
        self.max_images = max_images
        self.reset()

    def reset(self):
        self.encoded = []
        self.over_count = 0
        self.notes = []

    def refusal(self, width, height):
        """Why an image of this size is refused, or None; also counts the per-call limit."""
        if width <= 0 or height <= 0:
            return f"image refused: empty image of {width}x{height} pixels"
        if width * height > self.max_pixels:
            return (f"image refused: {width}x{height} pixels exceeds the limit of "
                    f"{self.max_pixels} pixels")
        if max(width, height) / min(width, height) >= self.max_aspect_ratio:
            return (f"image refused: {width}x{height} has an aspect ratio of at least "
                    f"{self.max_aspect_ratio:g}")
        if len(self.encoded) >= self.max_images:
            self.over_count += 1
            return ""
        return None

    def add_pil(self, image):
        refusal = self.refusal(*image.size)
        if refusal is None:
            if image.mode not in ("RGB", "RGBA", "L", "LA"):
                image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", compress_level=1)
            self.encoded.append(buffer.getvalue())
        elif refusal:
            self.notes.append(refusal)

    def add_figure(self, figure):
        width, height = (int(round(v)) for v in figure.get_size_inches() * figure.dpi)
        refusal = self.refusal(width, height)
        if refusal is None:
            canvas = figure.canvas
            if not isinstance(canvas, self._agg_canvas):
                canvas = self._agg_canvas(figure)
            canvas.draw()
            rgba = self._np.asarray(canvas.buffer_rgba())
            self.add_pil(self._image_module.fromarray(rgba[..., :3].copy(), "RGB"))
        elif refusal:
            self.notes.append(refusal)

    def summary_notes(self):
        notes = list(self.notes)
        if self.over_count:
            notes.append(f"{self.over_count} image(s) refused: at most {self.max_images} "
                         f"images are returned per call")
        return notes


def _install_matplotlib_backend(collector):
    """Registers a backend whose show() hands figures to the collector, then selects it."""
    import matplotlib
    from matplotlib._pylab_helpers import Gcf
    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    def show_managers(managers):
        for manager in managers:
            try:
                collector.add_figure(manager.canvas.figure)
            finally:
                Gcf.destroy(manager)

    class CaptureFigureManager(FigureManagerBase):
        def show(self):
            show_managers([self])

        @classmethod
        def pyplot_show(cls, *, block=None):
            show_managers(Gcf.get_all_fig_managers())

    class CaptureFigureCanvas(FigureCanvasAgg):
        manager_class = CaptureFigureManager

    module = types.ModuleType("pyvision_sandbox_backend")
    module.FigureCanvas = CaptureFigureCanvas
    module.FigureManager = CaptureFigureManager
    sys.modules[module.__name__] = module
    matplotlib.use("module://pyvision_sandbox_backend")
    matplotlib.rcParams["figure.max_open_warning"] = 0


def _make_display(collector):
    import numpy as np
    from matplotlib.figure import Figure
    from PIL import Image

    def display(*objects):
        """Shows PIL images, matplotlib figures and image arrays; prints anything else."""
        for obj in objects:
            if isinstance(obj, Image.Image):
                collector.add_pil(obj)
            elif isinstance(obj, Figure):
                collector.add_figure(obj)
            elif isinstance(obj, np.ndarray) and obj.ndim in (2, 3) and obj.dtype == np.uint8:
                collector.add_pil(Image.fromarray(obj))
            else:
                print(repr(obj))

    return display


def _set_limits(limits):
    for name, value in limits.items():
        kind = getattr(resource, name)
        resource.setrlimit(kind, (value, value))


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _seed_font_cache(source):
    """Copies matplotlib's font list built by the host, so that import skips the font scan."""
    if not source:
        return
    target = os.environ.get("MPLCONFIGDIR")
    try:
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(source):
            if name.startswith("fontlist-") and name.endswith(".json"):
                shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
    except (OSError, TypeError):
        pass  # matplotlib then builds its own


def _error_text(exc, skip_frames):
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


class Runtime:
    """Executes requests in one persistent namespace."""

    def __init__(self, settings):
        self.pid = _os_getpid()
        self.calls = 0
        self.capture = OutputCapture(settings["max_stdout_bytes"])
        self.stream = CaptureStream(self.capture, 1)
        self.collector = ImageCollector(settings["max_image_pixels"],
                                        settings["max_aspect_ratio"],
                                        settings["max_images_per_call"])
        self.drain = DescriptorDrain(self.capture, CAPTURE_READ_FD)
        self.namespace = self._prepare_namespace()
        self._builtins_snapshot = dict(vars(builtins))
        self._modules_snapshot = dict(sys.modules)

    def heal(self):
        """Puts back builtins and modules that user code replaced or deleted (names it added
        stay), so the runtime's own standard-library calls and later calls keep working."""
        vars(builtins).update(self._builtins_snapshot)
        sys.modules.update(self._modules_snapshot)

    def _prepare_namespace(self):
        import base64
        import math

        import matplotlib
        import numpy as np
        import PIL
        from PIL import Image

        _install_matplotlib_backend(self.collector)
        import matplotlib.pyplot as plt

        Image.preinit()
        display = _make_display(self.collector)
        Image.Image.show = lambda image, title=None: display(image)

        main_module = types.ModuleType("__main__")
        namespace = main_module.__dict__
        namespace.update(
            __builtins__=builtins, np=np, PIL=PIL, Image=Image, matplotlib=matplotlib,
            plt=plt, io=io, base64=base64, math=math, display=display)
        sys.modules["__main__"] = main_module
        return namespace

    def redirect_output(self):
        _os_dup2(CAPTURE_WRITE_FD, 1)
        _os_dup2(CAPTURE_WRITE_FD, 2)
        sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = self.stream

    def _begin(self):
        self.capture.reset()
        self.collector.reset()
        self.redirect_output()

    def _finish(self, message):
        if _os_getpid() != self.pid:
            _os_exit(0)  # a process forked by user code must never answer the host
        self.redirect_output()
        self.drain.sync()
        stdout, dropped = self.capture.take()
        notes = self.collector.summary_notes()
        images = self.collector.encoded
        self.collector.reset()
        message.update(stdout=stdout, stdout_dropped_bytes=dropped, notes=notes,
                       image_sizes=[len(image) for image in images])
        return message, images

    def run_code(self, code):
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
        error = None if raised is None else _error_text(raised, skip_frames=1)
        raised = None  # frees the frames (and their big locals) the traceback holds
        return self._finish({"error": error})

    def load_image(self, name, path):
        from PIL import Image

        self._begin()
        with Image.open(path) as image:
            self.namespace[name] = image.convert("RGB")
        return self._finish({"error": None})

    def load_video(self, name, path):
        from decord import VideoReader, cpu

        self._begin()
        self.namespace.update({name: VideoReader(path, ctx=cpu(0)),
                               "VideoReader": VideoReader, "cpu": cpu})
        return self._finish({"error": None})

    def handle(self, request):
        op = request.get("op")
        if op == "run":
            return self.run_code(request["code"])
        if op == "load_image":
            return self.load_image(request["name"], request["path"])
        if op == "load_video":
            return self.load_video(request["name"], request["path"])
        raise ValueError(f"unknown request op {op!r}")


def _move_descriptor(fd, target):
    if fd != target:
        _os_dup2(fd, target, inheritable=False)
        os.close(fd)
    else:
        os.set_inheritable(fd, False)


def main(argv):
    settings = json.loads(argv[1])
    _move_descriptor(settings["request_fd"], REQUEST_FD)
    _move_descriptor(settings["reply_fd"], REPLY_FD)
    _set_limits(settings["limits"])
    if settings.get("uid") is not None:
        _drop_privileges(settings["uid"], settings["gid"])
    os.chdir(settings["workdir"])
    _seed_font_cache(settings.get("font_cache"))

    capture_read, capture_write = os.pipe()
    _move_descriptor(capture_read, CAPTURE_READ_FD)
    _move_descriptor(capture_write, CAPTURE_WRITE_FD)
    null = os.open(os.devnull, os.O_RDONLY)
    _os_dup2(null, 0)
    os.close(null)

    threading.Thread(target=_watch_host, args=(REQUEST_FD,), daemon=True).start()
    try:
        runtime = Runtime(settings)
    except BaseException as exc:  # noqa: BLE001 - reported to the host, then exit
        write_frame(REPLY_FD, {"op": "ready", "seq": 0, "error": _error_text(exc, 0)})
        return 1
    runtime.redirect_output()
    threading.Thread(target=runtime.drain.run_forever, daemon=True).start()
    write_frame(REPLY_FD, {"op": "ready", "seq": 0, "error": None})

    while True:
        try:
            request = read_frame(REQUEST_FD)
        except EOFError:
            return 0
        seq = request.get("seq")
        try:
            message, images = runtime.handle(request)
        except BaseException as exc:  # noqa: BLE001 - runtime-side failure, reported
            if _os_getpid() != runtime.pid:
                _os_exit(0)
            message, images = {"error": "sandbox runtime error: " + _error_text(exc, 0)}, []
            message.update(stdout="", stdout_dropped_bytes=0, notes=[], image_sizes=[])
        message.update(op="reply", seq=seq)
        write_frame(REPLY_FD, message, images)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
