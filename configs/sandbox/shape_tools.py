# The helpers of the "shapes" tasks (pyvision_jax/data/shape_tasks.py), run in every episode's
# sandbox before the model's code (sandbox.setup_file); configs/prompts/shapes_image.txt names
# them. Plain runtime code: numpy as np and plt come from the runtime, the image is image_clue_0.
# ruff: noqa: F821
_PALETTE = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}


def _object_mask():
    a = np.asarray(image_clue_0).astype(int)
    return a, np.abs(a - a[0, 0]).sum(2) > 60


def colour():
    """The name of the object's colour."""
    a, m = _object_mask()
    p = np.median(a[m], 0)
    return min(_PALETTE, key=lambda name: np.abs(np.array(_PALETTE[name]) - p).sum())


def shape():
    """The object's shape, from how much of its bounding box it fills."""
    _, m = _object_mask()
    ys, xs = np.nonzero(m)
    fill = m[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].mean()
    return "triangle" if fill < 0.65 else "circle" if fill < 0.9 else "square"


def quick():
    """One glance: the colour, and the object taken for a circle."""
    print(colour(), "circle")


def look():
    """Shows the object, cropped."""
    _, m = _object_mask()
    ys, xs = np.nonzero(m)
    plt.imshow(np.asarray(image_clue_0)[max(ys.min() - 8, 0) : ys.max() + 9, max(xs.min() - 8, 0) : xs.max() + 9])
    plt.axis("off")
    plt.show()


def measure():
    """The colour and the shape."""
    print(colour(), shape())
