"""The exact plan accuracies of the shapes toys: the adaptive toy's bounds, the direct toy's
averages, and agreement with the sandbox helpers run on rendered tasks of the generator."""

from __future__ import annotations

import contextlib
import io
import math
from collections import Counter, defaultdict
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from experiments.plan_accuracy import (
    ANSWERS,
    PLANS,
    SHAPE_TOOLS,
    Cell,
    careful_right,
    helper_reading,
    plan_accuracy,
    summary,
)
from pyvision_jax.data.drawing import COLOURS
from pyvision_jax.data.shape_tasks import ADAPTIVE_KIND, DIRECT_KIND, LAYOUTS, generate_adaptive_shapes
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.grading.scoring import parse_choice


def test_the_adaptive_toy_pays_only_a_policy_that_chooses_its_plan_by_family():
    result = plan_accuracy(ADAPTIVE_KIND)
    assert result.best_input_independent() == Fraction(3, 4) <= 0.80
    assert result.best_constant() == ("A", Fraction(2, 3))
    assert result.best_mixture() == ("careful", Fraction(3, 4))
    plans, accuracy = result.best_per_family()
    assert plans == {"easy": "guess", "hard": "careful"} and accuracy == Fraction(19, 20) >= 0.92
    assert result.mean("careful", "easy") == Fraction(3, 5) and result.mean("careful", "hard") == Fraction(9, 10)
    assert result.mean("guess", "hard") == Fraction(1, 3)
    assert sum(result.shares.values()) == 1


def test_the_direct_toys_averages():
    result = plan_accuracy(DIRECT_KIND)
    assert (result.mean("guess"), result.mean("careful")) == (Fraction(5, 6), Fraction(3, 4))
    assert result.best_input_independent() == Fraction(5, 6)
    assert result.best_per_family()[1] == Fraction(39, 40)


def test_every_layout_has_figures_and_a_summary():
    for kind in LAYOUTS:
        data = plan_accuracy(kind).as_dict()
        assert set(data["by_family"]) == {"easy", "hard"}
        assert data["best_input_independent"] <= data["best_per_family"]["accuracy"]
    assert "best plan per family (guess on easy, careful on hard): 0.9500" in summary(plan_accuracy(ADAPTIVE_KIND))
    with pytest.raises(ValueError, match="unknown shapes kind 'shapes_round'"):
        plan_accuracy("shapes_round")


def test_a_fill_range_split_by_a_threshold_is_an_error():
    tilted = Cell("shapes_hard_tilted", "square", "red", Fraction(1))
    assert careful_right(tilted, lambda fill: "triangle") is False
    with pytest.raises(ValueError, match="tilted squares as any of"):
        careful_right(tilted, lambda fill: "triangle" if fill < 0.52 else "square")


def _printed(image: Image.Image, helper: str) -> str:
    namespace = {"np": np, "image_clue_0": image}
    exec(SHAPE_TOOLS.read_text(), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace[helper]()
    return out.getvalue().strip()


def _within(sampled: float, exact: Fraction, n: int) -> bool:
    """Within 4 standard errors of a binomial mean of `n` draws (exact where it is 0 or 1)."""
    p = float(exact)
    return abs(sampled - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_rendered_tasks_agree_with_the_exact_figures(tmp_path):
    result, reading = plan_accuracy(ADAPTIVE_KIND), helper_reading()
    tasks = load_tasks(generate_adaptive_shapes(tmp_path, 240, seed=31)).tasks
    right: dict[tuple[str, str], list[bool]] = defaultdict(list)
    abilities = Counter()
    for task in tasks:
        image = Image.open(task.image_path).convert("RGB")
        colour, shape = task.options["ABCD".index(task.answer)].split()
        quick = parse_choice(_printed(image, "quick"), task.options)
        measured = parse_choice(_printed(image, "measure"), task.options) == task.answer
        # measuring is right always or never on a cell: every task agrees with its cell
        assert measured == careful_right(Cell(task.ability, shape, colour, Fraction(1)), reading), task.id
        if sum(COLOURS[colour]) % 3 == 0:
            assert quick == "A", task.id
        abilities[task.ability] += 1
        family = task.ability.split("_")[1]
        for key in (task.ability, family):
            right[key, "careful"].append(measured)
            right[key, "quick"].append(quick == task.answer)
            for letter in ANSWERS:
                right[key, letter].append(task.answer == letter)
    for ability, share in result.shares.items():
        assert _within(abilities[ability] / len(tasks), share, len(tasks)), (ability, abilities)
    for (group, choice), outcomes in right.items():
        family = group if group in ("easy", "hard") else None
        exact = result.mean(choice, family) if family else result.accuracy[group][choice]
        assert _within(sum(outcomes) / len(outcomes), exact, len(outcomes)), (group, choice, exact)
    assert set(PLANS) - {"guess"} <= {choice for _, choice in right}
