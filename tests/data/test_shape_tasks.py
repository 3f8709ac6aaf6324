"""The shapes toy: its tasks, the sandbox helpers' accuracy per plan, the scripted plans and
reading a response's plan back."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.data.sft_solutions import RESULT_SLOT
from pyvision_jax.data.shape_plans import COLOUR_THOUGHTS, SHAPE_THOUGHTS, options_differ_in, plan_of, shape_plan
from pyvision_jax.data.shape_tasks import (
    HARD_SHAPES,
    generate_adaptive_shapes,
    generate_cluttered_shapes,
    generate_direct_shapes,
    generate_shapes,
)
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.grading.scoring import parse_choice

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "configs" / "sandbox" / "shape_tools.py"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return load_tasks(generate_shapes(tmp_path_factory.mktemp("shapes"), 120, seed=5)).tasks


def _printed(task, helper: str) -> str:
    namespace = {"np": np, "image_clue_0": Image.open(task.image_path).convert("RGB")}
    exec(TOOLS.read_text(), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace[helper]()
    return out.getvalue().strip()


def test_tasks_are_deterministic_and_alternate_families(tasks, tmp_path):
    again = load_tasks(generate_shapes(tmp_path, 6, seed=5)).tasks
    assert [t.to_row() | {"image_path": None} for t in again] == [t.to_row() | {"image_path": None} for t in tasks[:6]]
    assert Image.open(again[3].image_path).tobytes() == Image.open(tasks[3].image_path).tobytes()
    families = [t.ability.split("_")[1] for t in tasks]
    assert families[:4] == ["hard", "easy", "hard", "easy"]
    for task in tasks:
        if "easy" in task.ability:
            assert task.answer == "A" and all(o.endswith(" circle") for o in task.options)
        else:
            colour = task.options[0].split()[0]
            assert task.options[:3] == tuple(f"{colour} {shape}" for shape in HARD_SHAPES)
            assert not task.options[3].startswith(colour + " ") and task.answer in "ABC"
    tilted = sum("tilted" in t.ability for t in tasks)
    assert 5 <= tilted <= 35


def test_the_helpers_letters_follow_the_hard_options_order():
    tree = ast.parse(TOOLS.read_text())
    letters = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_LETTERS")
    assert ast.literal_eval(letters) == dict(zip(HARD_SHAPES, "ABC"))


def test_plan_accuracy_per_family(tasks):
    right = Counter()
    for task in tasks:
        family = task.ability.split("_")[1]
        for helper in ("quick", "measure"):
            right[family, helper] += parse_choice(_printed(task, helper), task.options) == task.answer
    per_family = len(tasks) // 2
    assert right["easy", "measure"] == per_family
    for family in ("easy", "hard"):
        assert 0.15 <= right[family, "quick"] / per_family <= 0.55, right
    assert right["hard", "measure"] / per_family >= 0.8


def test_cluttered_tasks_are_the_same_tasks_with_specks_that_mislead_measuring(tasks, tmp_path):
    cluttered = load_tasks(generate_cluttered_shapes(tmp_path, len(tasks), seed=5)).tasks
    speck = [t for t in cluttered if t.ability.endswith("_speck")]
    assert 4 <= len(speck) <= 22 and all(t.ability == "shapes_easy_speck" for t in speck)
    for plain, task in zip(tasks, cluttered):
        assert task.id == plain.id.replace("shapes-", "shapes_cluttered-", 1)
        assert (task.question, task.options, task.answer) == (plain.question, plain.options, plain.answer)
        if task not in speck:
            assert task.ability == plain.ability
            assert Image.open(task.image_path).tobytes() == Image.open(plain.image_path).tobytes()
    for task in speck:
        assert parse_choice(_printed(task, "measure"), task.options) != task.answer == "A"


def test_on_the_direct_toy_the_guess_beats_the_tools_on_average_but_not_on_hard_tasks(tmp_path):
    tasks = load_tasks(generate_direct_shapes(tmp_path, 160, seed=5)).tasks
    families = [t.ability.split("_")[1] for t in tasks]
    assert families[:8] == ["hard", "easy", "easy", "easy"] * 2
    speck = [t for t in tasks if t.ability.endswith("_speck")]
    assert 20 <= len(speck) <= 52 and all(t.ability == "shapes_easy_speck" for t in speck)
    right = Counter()
    for task in tasks:
        family = task.ability.split("_")[1]
        measured = parse_choice(_printed(task, "measure"), task.options) == task.answer
        right[family, "measure"] += measured
        right[family, "guess"] += task.answer == "A"
    assert right["easy", "measure"] == 120 - len(speck) and right["easy", "guess"] == 120
    assert right["hard", "measure"] / 40 >= 0.8 > 0.5 > right["hard", "guess"] / 40
    measure, guess = (right["easy", h] + right["hard", h] for h in ("measure", "guess"))
    assert guess > measure and 1.2 * measure > guess


def test_scripted_plans_follow_their_shares_and_read_back(tasks):
    plans = [
        shape_plan(tasks[0], np.random.default_rng([3, k]), guess_share=0.2, careful_share=0.3) for k in range(400)
    ]
    shares = Counter(p.strategy for p in plans)
    assert abs(shares["shapes/guess"] / 400 - 0.2) < 0.06 and abs(shares["shapes/careful"] / 400 - 0.3) < 0.07
    for plan in plans:
        text = "\n".join(plan.turns).replace(RESULT_SLOT, "B")
        assert plan_of(text) == plan.strategy.removeprefix("shapes/")
    careful = next(p for p in plans if p.strategy == "shapes/careful")
    assert [t.count("<code>") for t in careful.turns] == [1, 1, 0]
    assert plan_of("no answer and no code") == "other"
    with pytest.raises(ValueError, match="careful_share"):
        shape_plan(tasks[0], np.random.default_rng(0), guess_share=0.5, careful_share=0.6)


def test_plans_worded_by_options_differ_in_their_first_words_only_and_are_drawn_as_before(tmp_path):
    tasks = load_tasks(generate_adaptive_shapes(tmp_path, 6, seed=5)).tasks
    for task in tasks:
        differ_in = options_differ_in(task)
        assert differ_in == ("shape" if task.ability.startswith("shapes_hard") else "colour")
        thoughts = SHAPE_THOUGHTS if differ_in == "shape" else COLOUR_THOUGHTS
        for k in range(20):
            plain = shape_plan(task, np.random.default_rng([k]), guess_share=0.2, careful_share=0.3)
            worded = shape_plan(
                task, np.random.default_rng([k]), guess_share=0.2, careful_share=0.3, wording_by_options=True
            )
            plan = plain.strategy.removeprefix("shapes/")
            assert worded.strategy == plain.strategy
            assert worded.turns[0].startswith(thoughts[plan]) and worded.turns[1:] == plain.turns[1:]
            assert worded.turns[0].removeprefix(thoughts[plan]) == plain.turns[0].removeprefix(COLOUR_THOUGHTS[plan])
            assert plan_of("\n".join(worded.turns).replace(RESULT_SLOT, "B")) == plan
    firsts = [thought.split()[0][0] for thought in (*COLOUR_THOUGHTS.values(), *SHAPE_THOUGHTS.values())]
    assert len(set(firsts)) == 6  # every plan of either wording opens with its own letter
    with pytest.raises(ValueError, match="has none"):
        options_differ_in(dataclasses.replace(tasks[0], options=()))
