"""Images a call produces: figures shown through a matplotlib backend, and `display(...)` of
PIL images, figures and arrays, checked against the limits and encoded as PNG.

numpy, PIL and matplotlib are imported only once the runtime's limits are set and its
privileges dropped, so they are imported where they are used. matplotlib (about 0.7 s of
CPU with pyplot) is imported only when the code first uses it: most calls never do, and a
sandbox serves one episode."""

from __future__ import annotations

import builtins
import importlib
import io
import os
import sys
import types
from typing import Any, Callable

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring

BACKEND_MODULE = "pyvision_sandbox_backend"


class ImageCollector:
    """Checks and encodes the images one call produces."""

    def __init__(self, max_pixels: int, max_aspect_ratio: float, max_images: int):
        import numpy
        from PIL import Image

        self._np = numpy
        self._image_module = Image
        self.max_pixels = max_pixels
        self.max_aspect_ratio = max_aspect_ratio
        self.max_images = max_images
        self.reset()

    def reset(self) -> None:
        self.encoded: list[bytes] = []
        self.over_count = 0
        self.notes: list[str] = []

    def refusal(self, width: int, height: int) -> str | None:
        """Why an image of this size is refused, or None; also counts the per-call limit."""
        if width <= 0 or height <= 0:
            return f"image refused: empty image of {width}x{height} pixels"
        if width * height > self.max_pixels:
            return f"image refused: {width}x{height} pixels exceeds the limit of {self.max_pixels} pixels"
        if max(width, height) / min(width, height) >= self.max_aspect_ratio:
            return f"image refused: {width}x{height} has an aspect ratio of at least {self.max_aspect_ratio:g}"
        if len(self.encoded) >= self.max_images:
            self.over_count += 1
            return ""
        return None

    def add_pil(self, image: Any) -> None:
        refusal = self.refusal(*image.size)
        if refusal is None:
            if image.mode not in ("RGB", "RGBA", "L", "LA"):
                image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", compress_level=1)
            self.encoded.append(buffer.getvalue())
        elif refusal:
            self.notes.append(refusal)

    def add_figure(self, figure: Any) -> None:
        width, height = (int(round(v)) for v in figure.get_size_inches() * figure.dpi)
        refusal = self.refusal(width, height)
        if refusal is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            canvas = figure.canvas
            if not isinstance(canvas, FigureCanvasAgg):
                canvas = FigureCanvasAgg(figure)
            canvas.draw()
            rgba = self._np.asarray(canvas.buffer_rgba())
            self.add_pil(self._image_module.fromarray(rgba[..., :3].copy(), "RGB"))
        elif refusal:
            self.notes.append(refusal)

    def summary_notes(self) -> list[str]:
        notes = list(self.notes)
        if self.over_count:
            notes.append(f"{self.over_count} image(s) refused: at most {self.max_images} images are returned per call")
        return notes


class LazyModule(types.ModuleType):
    """A module of the user namespace (`plt`, `matplotlib`) imported on first attribute use."""

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attribute)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__name__))


def _capture_backend(collector: ImageCollector) -> tuple[type, type]:
    """(FigureCanvas, FigureManager) of a backend whose show() hands figures to the collector."""
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

    matplotlib.rcParams["figure.max_open_warning"] = 0
    return CaptureFigureCanvas, CaptureFigureManager


def install_matplotlib_backend(collector: ImageCollector) -> None:
    """Makes the capturing backend matplotlib's default without importing matplotlib: the
    backend module is registered now (`MPLBACKEND` names it) and its classes are made when
    pyplot first asks for them, however the code imported matplotlib."""
    module = types.ModuleType(BACKEND_MODULE)

    def build(name: str) -> Any:
        if name not in ("FigureCanvas", "FigureManager"):
            raise AttributeError(f"module {BACKEND_MODULE!r} has no attribute {name!r}")
        module.FigureCanvas, module.FigureManager = _capture_backend(collector)
        return getattr(module, name)

    module.__getattr__ = build
    sys.modules[BACKEND_MODULE] = module
    os.environ["MPLBACKEND"] = f"module://{BACKEND_MODULE}"


def make_display(collector: ImageCollector) -> Callable[..., None]:
    """The `display` function of the user namespace."""
    import numpy as np
    from PIL import Image

    def display(*objects):
        """Shows PIL images, matplotlib figures and image arrays; prints anything else."""
        figure_module = sys.modules.get("matplotlib.figure")  # no figure exists before its import
        for obj in objects:
            if isinstance(obj, Image.Image):
                collector.add_pil(obj)
            elif figure_module is not None and isinstance(obj, figure_module.Figure):
                collector.add_figure(obj)
            elif isinstance(obj, np.ndarray) and obj.ndim in (2, 3) and obj.dtype == np.uint8:
                collector.add_pil(Image.fromarray(obj))
            else:
                print(repr(obj))

    return display
