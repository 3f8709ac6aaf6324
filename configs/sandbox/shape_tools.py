# The helpers of the "shapes" tasks (pyvision_jax/data/shape_tasks.py), run in every episode's
# sandbox before the model's code (sandbox.setup_file); configs/prompts/shapes_image.txt names
# them. Plain runtime code: numpy as np and plt come from the runtime, the image is image_clue_0.
# Each prints an option's letter: the options list the object as a circle (A), a square (B) and
# a triangle (C).
# ruff: noqa: F821
_LETTERS = {"circle": "A", "square": "B", "triangle": "C"}


def _object_mask():
    a = np.asarray(image_clue_0).astype(int)
    return np.abs(a - a[0, 0]).sum(2) > 60


def shape():
    """The object's shape, from how much of its bounding box it fills."""
    ys, xs = np.nonzero(_object_mask())
    fill = _object_mask()[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].mean()
    return "triangle" if fill < 0.65 else "circle" if fill < 0.9 else "square"


def quick():
    """One glance: a guess at the option (drawn from the pixels, not measured)."""
    print("ABC"[int(np.asarray(image_clue_0)[::7, ::5].sum()) % 3])


def look():
    """Shows the object, cropped."""
    ys, xs = np.nonzero(_object_mask())
    plt.imshow(np.asarray(image_clue_0)[max(ys.min() - 8, 0) : ys.max() + 9, max(xs.min() - 8, 0) : xs.max() + 9])
    plt.axis("off")
    plt.show()


def measure():
    """The letter of the option with the measured shape."""
    print(_LETTERS[shape()])
