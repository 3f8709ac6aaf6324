"""The "shapes" kind: a toy built for mode selection, where the policy's likeliest plan is not
its best one.

Each image holds one coloured object; the question asks which object it is, with four
options named "<colour> <shape>". Two families alternate (even indices hard, odd easy):

- hard: a circle, square or triangle; the options are (A) the object's colour as a circle, (B)
  as a square, (C) as a triangle and (D) another colour. Three in ten objects are tilted by
  30-60 degrees.
- easy: always an upright circle, the four options four colours of circle, the right one
  listed first (a position bias that pays an untooled guess of "A").

The sandbox helpers (configs/sandbox/shape_tools.py) make the plans of `data.shape_plans`; each
prints an option's letter, which the answer copies: `quick()` guesses (a letter of the pixels'
sum: "A" on purple objects, otherwise any of A-C; right on 4/9 of easy tasks and 1/3 of hard
ones); `look()` then `measure()` reads the shape from how much of its bounding box the object
fills (right on every easy task, and on hard ones except tilted squares, whose fill reads as a
triangle's: 9 in 10); an untooled guess of "A" is right on every easy task and the hard tasks'
circles. Every file depends only on (seed, index).

The "shapes_cluttered" kind is the same tasks with a stray speck in the far corner of one easy
image in ten (`CLUTTER_SHARE`): measuring reads the speck into the object's bounding box and
answers wrong there, so on the easy family the tools cost accuracy that a guess does not (a
task family for the tool-reward ablation: with the tool bonus of 0.1 a call, the careful plan
still out-earns the guess on it, 0.9 x 1.2 against 1; without it, the guess wins, 1 against 0.9).

The "shapes_direct" kind is the toy where answering directly pays on most tasks, as on the
paper's benchmarks: one task in four is hard and three easy images in ten carry the speck.
Averaged over the generator's tasks, an untooled guess is then right more often than the careful
plan (5/6 = 0.833 against 3/4 = 0.750), so under the accuracy reward alone a policy that does
not tell the families apart gains by dropping the tools; with the tool bonus the careful plan
earns more (0.750 x 1.2 = 0.900), and it is still the best plan on the hard family (0.9 against
1/3).

The "shapes_adaptive" kind is the toy where choosing the plan by family pays: half the tasks
hard, as in "shapes", and four easy images in ten with the speck. No plan and no constant answer
is right on more than 3/4 of its tasks (the careful plan: 0.6 on easy tasks, 0.9 on hard ones;
the guess: 1 and 1/3), while guessing on the easy family and measuring on the hard one is right
on 0.95.

(Exact figures of every kind, per family: `python -m experiments.plan_accuracy`.)
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pyvision_jax.data.drawing import BACKGROUND, COLOURS
from pyvision_jax.data.tasks import Task, write_tasks_jsonl

KIND = "shapes"
CLUTTERED_KIND = "shapes_cluttered"
CLUTTER_SHARE = 0.1
DIRECT_KIND = "shapes_direct"
ADAPTIVE_KIND = "shapes_adaptive"
SPECK_SIZE = 6
SPECK_COLOUR = (70, 70, 70)
DATA_SOURCE = "synthetic_shapes"
HARD_SHAPES = ("circle", "square", "triangle")
TILT_SHARE = 0.3
TILT_DEGREES = (30.0, 60.0)
OBJECT_SIZES = (70.0, 110.0)
"""The range of an object's bounding-box side; its centre lies 3/4 of that side from every edge."""
CANVAS = 224
_KIND_CODE = 4
_LETTERS = "ABCD"


@dataclasses.dataclass(frozen=True)
class ShapeLayout:
    """How a shapes kind mixes its tasks: task `index` is hard when `hard_every` divides it, and
    an easy image carries the speck with probability `clutter_share`."""

    hard_every: int
    clutter_share: float


LAYOUTS: dict[str, ShapeLayout] = {
    KIND: ShapeLayout(2, 0.0),
    CLUTTERED_KIND: ShapeLayout(2, CLUTTER_SHARE),
    DIRECT_KIND: ShapeLayout(4, 0.3),
    ADAPTIVE_KIND: ShapeLayout(2, 0.4),
}


def family_of(index: int, hard_every: int = 2) -> str:
    """Task `index` is hard when `hard_every` divides it (every other task by default)."""
    return "hard" if index % hard_every == 0 else "easy"


def _outline(shape: str, cx: float, cy: float, size: float, angle: float) -> list[tuple[float, float]]:
    """The polygon of a square or triangle of bounding-box side `size`, turned by `angle`."""
    r = size / 2
    corners = [(-r, -r), (r, -r), (r, r), (-r, r)] if shape == "square" else [(0.0, -r), (r, r), (-r, r)]
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in corners]


def draw_object(image: Image.Image, shape: str, colour: str, cx: float, cy: float, size: float, angle: float) -> None:
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        r = size / 2
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[colour])
    else:
        draw.polygon(_outline(shape, cx, cy, size, angle), fill=COLOURS[colour])


def _pick(rng: np.random.Generator, items: tuple | list, exclude: tuple = ()) -> str:
    pool = [x for x in items if x not in exclude]
    return pool[int(rng.integers(len(pool)))]


def _draw_speck(image: Image.Image, cx: float, cy: float, canvas: int) -> None:
    """A small grey square in the canvas corner farthest from the object's centre."""
    far = canvas - 8 - SPECK_SIZE
    x = 8 if cx > canvas / 2 else far
    y = 8 if cy > canvas / 2 else far
    ImageDraw.Draw(image).rectangle([x, y, x + SPECK_SIZE - 1, y + SPECK_SIZE - 1], fill=SPECK_COLOUR)


def shape_task(
    out_dir: Path,
    seed: int,
    index: int,
    canvas: int = CANVAS,
    *,
    kind: str = KIND,
    clutter_share: float = 0.0,
    hard_every: int = 2,
) -> Task:
    """Task `index` of `seed` (its image written under `out_dir`); an easy task carries a speck
    with probability `clutter_share`, drawn apart from everything else, so the task is
    otherwise the same for every share."""
    rng = np.random.default_rng([seed, _KIND_CODE, index])
    family = family_of(index, hard_every)
    speck = family == "easy" and bool(np.random.default_rng([seed, _KIND_CODE, index, 1]).random() < clutter_share)
    colour = _pick(rng, list(COLOURS))
    shape = _pick(rng, HARD_SHAPES) if family == "hard" else "circle"
    tilted = family == "hard" and bool(rng.random() < TILT_SHARE)
    angle = math.radians(float(rng.uniform(*TILT_DEGREES))) if tilted else 0.0
    size = float(rng.uniform(*OBJECT_SIZES))
    margin = size * 0.75
    cx, cy = (float(v) for v in rng.uniform(margin, canvas - margin, size=2))
    image = Image.new("RGB", (canvas, canvas), BACKGROUND)
    draw_object(image, shape, colour, cx, cy, size, angle)
    if speck:
        _draw_speck(image, cx, cy, canvas)
    right = f"{colour} {shape}"
    if family == "hard":
        other = _pick(rng, list(COLOURS), (colour,))
        options = [f"{colour} {s}" for s in HARD_SHAPES] + [f"{other} {_pick(rng, HARD_SHAPES)}"]
    else:
        others = [c for c in COLOURS if c != colour]
        options = [right] + [f"{others[int(i)]} circle" for i in rng.permutation(len(others))[:3]]
    path = out_dir / f"{kind}_{index:04d}.png"
    image.save(path)
    return Task(
        id=f"{kind}-{seed}-{index:04d}",
        question="Which object is in the image?",
        answer=_LETTERS[options.index(right)],
        answer_type="multiple_choice",
        data_source=DATA_SOURCE,
        image_path=str(path),
        options=tuple(options),
        ability=f"shapes_{family}" + ("_tilted" if tilted else "") + ("_speck" if speck else ""),
    )


def _generate(kind: str, out_dir: str | Path, num_tasks: int, seed: int) -> Path:
    layout = LAYOUTS[kind]
    out_dir = Path(out_dir)
    media_dir = out_dir / kind
    media_dir.mkdir(parents=True, exist_ok=True)
    tasks = [
        shape_task(media_dir, seed, i, kind=kind, clutter_share=layout.clutter_share, hard_every=layout.hard_every)
        for i in range(num_tasks)
    ]
    path = out_dir / f"{kind}.jsonl"
    write_tasks_jsonl(path, tasks)
    return path


def generate_shapes(out_dir: str | Path, num_tasks: int, seed: int, *, progress: bool = False) -> Path:
    """Writes `num_tasks` shape tasks (half hard, half easy) and ``shapes.jsonl``; returns its path."""
    return _generate(KIND, out_dir, num_tasks, seed)


def generate_cluttered_shapes(out_dir: str | Path, num_tasks: int, seed: int, *, progress: bool = False) -> Path:
    """The same tasks with a speck on one easy image in ten, and ``shapes_cluttered.jsonl``."""
    return _generate(CLUTTERED_KIND, out_dir, num_tasks, seed)


def generate_direct_shapes(out_dir: str | Path, num_tasks: int, seed: int, *, progress: bool = False) -> Path:
    """One hard task in four and a speck on three easy images in ten, and ``shapes_direct.jsonl``."""
    return _generate(DIRECT_KIND, out_dir, num_tasks, seed)


def generate_adaptive_shapes(out_dir: str | Path, num_tasks: int, seed: int, *, progress: bool = False) -> Path:
    """Half the tasks hard and a speck on four easy images in ten, and ``shapes_adaptive.jsonl``."""
    return _generate(ADAPTIVE_KIND, out_dir, num_tasks, seed)
