"""The palette, the shapes and the drawing every synthetic task kind shares."""

from __future__ import annotations

from PIL import ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle", "diamond")
BACKGROUND = (236, 236, 230)


def draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, size: float, colour: tuple[int, int, int]
) -> None:
    """Draws a filled shape of bounding-box side ``size`` centred at (cx, cy)."""
    r = size / 2
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


__all__ = ["BACKGROUND", "COLOURS", "SHAPES", "draw_shape"]
