"""Images a call produces: figures shown through a matplotlib backend, and `display(...)` of
PIL images, figures and arrays, checked against the limits and encoded as PNG.

numpy, PIL and matplotlib are imported only once the runtime's limits are set and its
privileges dropped, so they are imported where they are used."""

from __future__ import annotations

import builtins

globals()["__builtins__"] = dict(vars(builtins))  # a private copy: see the package docstring

import io  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from typing import Any, Callable  # noqa: E402


class ImageCollector:
    """Checks and encodes the images one call produces."""

    def __init__(self, max_pixels: int, max_aspect_ratio: float, max_images: int):
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

    def reset(self) -> None:
        self.encoded: list[bytes] = []
        self.over_count = 0
        self.notes: list[str] = []

    def refusal(self, width: int, height: int) -> str | None:
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
            canvas = figure.canvas
            if not isinstance(canvas, self._agg_canvas):
                canvas = self._agg_canvas(figure)
            canvas.draw()
            rgba = self._np.asarray(canvas.buffer_rgba())
            self.add_pil(self._image_module.fromarray(rgba[..., :3].copy(), "RGB"))
        elif refusal:
            self.notes.append(refusal)

    def summary_notes(self) -> list[str]:
        notes = list(self.notes)
        if self.over_count:
            notes.append(f"{self.over_count} image(s) refused: at most {self.max_images} "
                         f"images are returned per call")
        return notes


def install_matplotlib_backend(collector: ImageCollector) -> None:
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


def make_display(collector: ImageCollector) -> Callable[..., None]:
    """The `display` function of the user namespace."""
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
