"""Each plan's exact accuracy per task family on the shapes toys (`data.shape_tasks`), from the
generator's distribution and what the sandbox helpers (configs/sandbox/shape_tools.py) print,
not from samples; and the input-independent baselines it bounds: the best constant answer, the
best fixed mixture of plans, and against them the best plan chosen per family.

The generator draws a task's family from its index (`LAYOUTS[kind].hard_every`), a colour
uniformly from `COLOURS`, on a hard task a shape uniformly from `HARD_SHAPES` and a tilt with
probability `TILT_SHARE`, on an easy one a speck with probability `clutter_share`. Each such
cell (an ability of `shape_task`, a shape, a colour) is enumerated with its probability, and
what each plan answers there:

- careful: `measure()` reads the shape from the share of its bounding box the object fills. The
  fill follows from the geometry over the generator's whole range (a circle pi / 4, a square
  turned by a 1 / (|cos a| + |sin a|)^2, a triangle's likewise; with a speck, at most the
  object's and the speck's area over the smallest box that holds both), widened by
  `RASTER_SLACK` for the pixels, and the helper's own `shape()` reads every fill of that range;
  the range has one reading on every cell (else `ValueError`), so the plan is right there
  always or never.
- guess: the answer "A"; a constant answer is right where it is the right letter.
- quick: `quick()` prints "ABC"[(sum of the pixels it samples) mod 3]. The background's and
  the speck's channel sums are multiples of 3, so the letter is that of (n x the colour's
  channel sum) mod 3, n the object's pixels among those sampled: always "A" for a colour whose
  sum is a multiple of 3, and otherwise each letter with 1/3, taking n mod 3 as uniform over the
  sizes and positions drawn. That is the one figure modelled rather than derived;
  tests/experiments/test_plan_accuracy.py checks it against rendered tasks.

Fractions stay exact (`fractions.Fraction`) up to the reported floats. A fixed mixture of plans
scores the same mixture of their accuracies, so the best one is a single plan.

    python -m experiments.plan_accuracy --kinds shapes_adaptive,shapes_direct --out adaptive_toy.json
"""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from absl import flags

from pyvision_jax.cli.entry import run_command
from pyvision_jax.data.config_files import CONFIGS_DIR
from pyvision_jax.data.drawing import BACKGROUND, COLOURS
from pyvision_jax.data.shape_tasks import (
    CANVAS,
    HARD_SHAPES,
    LAYOUTS,
    OBJECT_SIZES,
    SPECK_COLOUR,
    SPECK_SIZE,
    TILT_DEGREES,
    TILT_SHARE,
    ShapeLayout,
)

SHAPE_TOOLS = CONFIGS_DIR / "sandbox" / "shape_tools.py"
PLANS = ("quick", "careful", "guess")
ANSWERS = ("A", "B", "C", "D")
FAMILIES = ("easy", "hard")
NOTE = (
    "Exact accuracies from the generator's distribution and the sandbox helpers' code, not from "
    "samples (any machine gives the same figures); quick()'s letter is modelled as uniform on "
    "colours whose channel sum is not a multiple of 3 (experiments/plan_accuracy.py)."
)
_GRID = 121
RASTER_SLACK = 0.03
"""A bound on how far a drawn object's pixels fill their box off its geometry at the generator's
sizes (70-110 pixels; a circle of 70 fills 0.782 of its pixel box, pi / 4 = 0.785): every fill
is read at its value and this far either side."""
"""Points at which a range of sizes or angles is evaluated (every 0.25 degrees of a tilt)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """Tasks alike for every plan: the ability `shape_task` gives them, the object, and their
    share of the kind's tasks."""

    ability: str
    shape: str
    colour: str
    share: Fraction

    @property
    def family(self) -> str:
        return self.ability.split("_")[1]

    @property
    def answer(self) -> str:
        return "A" if self.family == "easy" else "ABC"[HARD_SHAPES.index(self.shape)]


def _share(value: float) -> Fraction:
    return Fraction(value).limit_denominator(1000)


def cells(layout: ShapeLayout) -> list[Cell]:
    """Every (ability, shape, colour) of a kind with its probability (they sum to 1)."""
    hard, speck, tilt = Fraction(1, layout.hard_every), _share(layout.clutter_share), _share(TILT_SHARE)
    colour = Fraction(1, len(COLOURS))
    out = []
    for c in COLOURS:
        out.append(Cell("shapes_easy", "circle", c, (1 - hard) * (1 - speck) * colour))
        out.append(Cell("shapes_easy_speck", "circle", c, (1 - hard) * speck * colour))
        for shape in HARD_SHAPES:
            each = hard * colour / len(HARD_SHAPES)
            out.append(Cell("shapes_hard", shape, c, each * (1 - tilt)))
            out.append(Cell("shapes_hard_tilted", shape, c, each * tilt))
    return [cell for cell in out if cell.share]


def _fill(shape: str, angle: float) -> float:
    """The share of its bounding box a shape turned by `angle` (radians) fills."""
    if shape == "circle":
        return math.pi / 4
    corners = [(-1, -1), (1, -1), (1, 1), (-1, 1)] if shape == "square" else [(0, -1), (1, 1), (-1, 1)]
    c, s = math.cos(angle), math.sin(angle)
    xs, ys = zip(*((x * c - y * s, x * s + y * c) for x, y in corners))
    area = 4.0 if shape == "square" else 2.0
    return area / ((max(xs) - min(xs)) * (max(ys) - min(ys)))


def fills(cell: Cell) -> list[float]:
    """The fills `measure()` can see on a cell's tasks, over the generator's range."""
    if cell.ability.endswith("_speck"):
        # The speck lies in the corner away from the object's centre, so the box holding both
        # spans at least half the canvas plus the object's radius, less the speck's inset of 9
        # pixels, and at most the canvas.
        lowest = math.pi * (OBJECT_SIZES[0] / 2) ** 2 / CANVAS**2
        highest = max(
            (math.pi * (d / 2) ** 2 + SPECK_SIZE**2) / (CANVAS / 2 + d / 2 - 9) ** 2
            for d in np.linspace(*OBJECT_SIZES, _GRID)
        )
        return list(np.linspace(lowest, highest, _GRID))
    if cell.ability.endswith("_tilted"):
        return [_fill(cell.shape, math.radians(a)) for a in np.linspace(*TILT_DEGREES, _GRID)]
    return [_fill(cell.shape, 0.0)]


def helper_reading() -> Callable[[float], str]:
    """`shape()` of the sandbox helpers as a function of the fill: it runs the helper's own code
    on a mask whose bounding box is the whole mask and of which `fill` is set (to 1/200)."""
    namespace: dict[str, Any] = {"np": np}
    exec(compile(SHAPE_TOOLS.read_text(), str(SHAPE_TOOLS), "exec"), namespace)

    def reading(fill: float) -> str:
        side = 200
        mask = np.zeros((side, side), bool)
        mask[:, 0] = mask[0, :] = True
        mask.flat[: round(fill * side * side)] = True
        namespace["_object_mask"] = lambda: mask
        return namespace["shape"]()

    return reading


def careful_right(cell: Cell, reading: Callable[[float], str]) -> bool:
    """Whether `measure()`'s letter is the answer on every task of the cell."""
    near = (-RASTER_SLACK, 0.0, RASTER_SLACK)
    readings = {reading(min(max(f + d, 0.0), 1.0)) for f in fills(cell) for d in near}
    if len(readings) != 1:
        raise ValueError(f"{SHAPE_TOOLS}: shape() reads the {cell.ability} {cell.shape}s as any of {sorted(readings)}")
    return "ABC"[HARD_SHAPES.index(readings.pop())] == cell.answer


def quick_letters(colour: str) -> dict[str, Fraction]:
    """{letter: probability} of `quick()`'s letter on an image of a `colour` object."""
    for name, rgb in (("background", BACKGROUND), ("speck", SPECK_COLOUR)):
        if sum(rgb) % 3:
            raise ValueError(f"quick()'s letter: the {name} colour {rgb} has a channel sum not divisible by 3")
    if sum(COLOURS[colour]) % 3 == 0:
        return {"A": Fraction(1)}
    return dict.fromkeys("ABC", Fraction(1, 3))


@dataclasses.dataclass(frozen=True)
class PlanAccuracy:
    """Each choice's (plan's or constant answer's) exact accuracy on each ability of a kind."""

    kind: str
    shares: Mapping[str, Fraction]
    accuracy: Mapping[str, Mapping[str, Fraction]]

    def group_shares(self, family: str | None = None) -> dict[str, Fraction]:
        return {a: s for a, s in self.shares.items() if family is None or a.split("_")[1] == family}

    def mean(self, choice: str, family: str | None = None) -> Fraction:
        """The choice's accuracy over the kind's tasks, or those of one family."""
        shares = self.group_shares(family)
        return sum(s * self.accuracy[a][choice] for a, s in shares.items()) / sum(shares.values())

    def family_share(self, family: str) -> Fraction:
        return sum(self.group_shares(family).values())

    def best_constant(self) -> tuple[str, Fraction]:
        """The constant answer right most often, the first letter among equals."""
        return max(((a, self.mean(a)) for a in ANSWERS), key=lambda pair: pair[1])

    def best_mixture(self) -> tuple[str, Fraction]:
        """The best fixed mixture of plans: its best single plan."""
        return max(((p, self.mean(p)) for p in PLANS), key=lambda pair: pair[1])

    def best_input_independent(self) -> Fraction:
        return max(self.best_constant()[1], self.best_mixture()[1])

    def best_per_family(self) -> tuple[dict[str, str], Fraction]:
        """The plan right most often on each family (easy, hard: the options tell them apart)
        and the accuracy of choosing it there."""
        plans = {f: max(PLANS, key=lambda p: self.mean(p, f)) for f in FAMILIES if self.family_share(f)}
        return plans, sum(self.family_share(f) * self.mean(plans[f], f) for f in plans)

    def as_dict(self) -> dict[str, Any]:
        plans, per_family = self.best_per_family()
        constant, mixture = self.best_constant(), self.best_mixture()
        choices = PLANS + ANSWERS

        def row(family: str | None, share: Fraction) -> dict[str, Any]:
            return {"share": float(share), **{c: round(float(self.mean(c, family)), 4) for c in choices}}

        return {
            "kind": self.kind,
            "by_ability": {
                a: {"share": float(s), **{c: round(float(self.accuracy[a][c]), 4) for c in choices}}
                for a, s in self.shares.items()
            },
            "by_family": {f: row(f, self.family_share(f)) for f in FAMILIES if self.family_share(f)},
            "all": row(None, Fraction(1)),
            "best_constant": {"answer": constant[0], "accuracy": round(float(constant[1]), 4)},
            "best_mixture": {"plan": mixture[0], "accuracy": round(float(mixture[1]), 4)},
            "best_input_independent": round(float(self.best_input_independent()), 4),
            "best_per_family": {"plans": plans, "accuracy": round(float(per_family), 4)},
        }


def plan_accuracy(kind: str) -> PlanAccuracy:
    """The exact accuracies of a shapes kind (a key of `LAYOUTS`)."""
    if kind not in LAYOUTS:
        raise ValueError(f"plan accuracy: unknown shapes kind {kind!r}; expected one of {sorted(LAYOUTS)}")
    reading = helper_reading()
    measured: dict[tuple[str, str], bool] = {}
    shares: dict[str, Fraction] = {}
    totals: dict[str, dict[str, Fraction]] = {}
    for cell in cells(LAYOUTS[kind]):
        right = {letter: Fraction(letter == cell.answer) for letter in ANSWERS}
        right["guess"] = right["A"]
        key = (cell.ability, cell.shape)
        if key not in measured:
            measured[key] = careful_right(cell, reading)
        right["careful"] = Fraction(measured[key])
        right["quick"] = quick_letters(cell.colour).get(cell.answer, Fraction(0))
        shares[cell.ability] = shares.get(cell.ability, Fraction(0)) + cell.share
        total = totals.setdefault(cell.ability, dict.fromkeys(right, Fraction(0)))
        for choice, value in right.items():
            total[choice] += cell.share * value
    accuracy = {a: {c: v / shares[a] for c, v in total.items()} for a, total in totals.items()}
    return PlanAccuracy(kind, shares, accuracy)


def summary(result: PlanAccuracy) -> str:
    """The per-family table and the baselines of one kind, as lines of text."""
    data = result.as_dict()
    lines = [f"{result.kind}: accuracy by family (share of tasks), exact"]
    lines.append(f"  {'tasks':>12s} " + " ".join(f"{c:>7s}" for c in ("share",) + PLANS + ANSWERS))
    for name, row in list(data["by_ability"].items()) + list(data["by_family"].items()) + [("all", data["all"])]:
        values = " ".join(f"{row[c]:7.3f}" for c in ("share",) + PLANS + ANSWERS)
        lines.append(f"  {name.removeprefix('shapes_'):>12s} {values}")
    plans = ", ".join(f"{p} on {f}" for f, p in data["best_per_family"]["plans"].items())
    lines.append(
        f"  best constant answer {data['best_constant']['answer']}: {data['best_constant']['accuracy']:.4f}; "
        f"best fixed mixture of plans ({data['best_mixture']['plan']}): {data['best_mixture']['accuracy']:.4f}; "
        f"best plan per family ({plans}): {data['best_per_family']['accuracy']:.4f}"
    )
    return "\n".join(lines)


def define_flags() -> None:
    """The command's flags, defined only when it runs: the module is also imported by tests
    beside other commands that define flags of the same names."""
    flags.DEFINE_list("kinds", list(LAYOUTS), "Shapes kinds (keys of data.shape_tasks.LAYOUTS).")
    flags.DEFINE_string("out", "", "Write the figures to this JSON file.")


def main(argv: list[str]) -> None:
    kinds, out = flags.FLAGS.kinds, flags.FLAGS.out
    results = [plan_accuracy(kind) for kind in kinds]
    for result in results:
        print(summary(result))
    if out:
        command = f"python -m experiments.plan_accuracy --kinds {','.join(kinds)} --out {out}"
        payload = {"command": command, "note": NOTE, "kinds": {r.kind: r.as_dict() for r in results}}
        Path(out).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    define_flags()
    run_command(__name__, main)
