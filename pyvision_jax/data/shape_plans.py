"""Scripted plans of the "shapes" tasks (`data.shape_tasks`) and the plan a response follows.

Three plans, drawn per (task, draw) with seeded shares, so the SFT model's likeliest plan is
not its best one:

- quick (the rest of the shares): one call of `quick()` (a guessed letter), then its printed
  letter as the answer;
- careful (`careful_share`): `look()`, then `measure()`, then the measured letter;
- guess (`guess_share`): no tool call, the answer "A".

With `wording_by_options` a plan's first thought is worded by what the task's options differ
in (`options_differ_in`): the thoughts above where they differ in colour, `SHAPE_THOUGHTS` (other
first words) where they differ in shape. The plan is still drawn apart from the wording, so the
SFT data holds each plan in the same share on every task; what differs is the token that chooses it.
At the small model's size this is what lets updates move one family's plans without the other's:
with one wording, the model's state where it picks its plan hardly depends on the task, and
GRPO moves both families' plans alike (docs/learning.md#learning-when-to-use-tools).

`plan_of` reads the plan back from a response (the plan share of a policy's samples).
"""

from __future__ import annotations

import numpy as np

from pyvision_jax.data.sft_solutions import RESULT_SLOT, SolutionPlan, answer_turn, code_turn
from pyvision_jax.data.tasks import Task

PLANS = ("quick", "careful", "guess", "other")
QUICK_THOUGHT = "A quick glance."
LOOK_THOUGHT = "Carefully: first a look at the object."
MEASURE_THOUGHT = "Now measure its shape."
GUESS_THOUGHT = "I can answer directly."
COLOUR_THOUGHTS = {"quick": QUICK_THOUGHT, "careful": LOOK_THOUGHT, "guess": GUESS_THOUGHT}
"""The first thought of each plan: every task's, or with `wording_by_options` the tasks' whose
options differ in colour."""
SHAPE_THOUGHTS = {
    "quick": "Quick glance at the shape.",
    "careful": "Look closely: first the object.",
    "guess": "No tools needed.",
}
"""The first thought of each plan on tasks whose options differ in shape, with `wording_by_options`."""


def options_differ_in(task: Task) -> str:
    """ "colour" when a shapes task's options all name one shape (the easy family's four colours of
    circle), otherwise "shape"."""
    if not task.options:
        raise ValueError(f"task {task.id}: a shapes task has options; this one has none")
    return "colour" if len({option.rsplit(" ", 1)[-1] for option in task.options}) == 1 else "shape"


def scripted_plan(plan: str, thoughts: dict[str, str] = COLOUR_THOUGHTS) -> SolutionPlan:
    """The scripted trajectory of one plan ("quick", "careful" or "guess"), its first thought
    from `thoughts`."""
    if plan == "guess":
        return SolutionPlan((f"{thoughts['guess']}\n" + answer_turn("A"),), "shapes/guess", True)
    if plan == "careful":
        turns = (
            code_turn(thoughts["careful"], "look()"),
            code_turn(MEASURE_THOUGHT, "measure()"),
            answer_turn(RESULT_SLOT),
        )
        return SolutionPlan(turns, "shapes/careful", False)
    if plan == "quick":
        return SolutionPlan((code_turn(thoughts["quick"], "quick()"), answer_turn(RESULT_SLOT)), "shapes/quick", True)
    raise ValueError(f"unknown shapes plan {plan!r}; expected one of {PLANS[:3]}")


def shape_plan(
    task: Task, rng: np.random.Generator, *, guess_share: float, careful_share: float, wording_by_options: bool = False
) -> SolutionPlan:
    """One scripted trajectory of a shapes task (see the module docstring)."""
    if min(guess_share, careful_share) < 0 or guess_share + careful_share > 1:
        raise ValueError(f"guess_share {guess_share} and careful_share {careful_share} must be >= 0 with a sum <= 1")
    draw = float(rng.random())
    thoughts = SHAPE_THOUGHTS if wording_by_options and options_differ_in(task) == "shape" else COLOUR_THOUGHTS
    if draw < guess_share:
        return scripted_plan("guess", thoughts)
    return scripted_plan("careful" if draw < guess_share + careful_share else "quick", thoughts)


def plan_of(response: str) -> str:
    """The plan a shapes response follows: "careful" (it measured), "quick" (it called only
    `quick()`), "guess" (no code) or "other"."""
    if "measure()" in response:
        return "careful"
    if "quick()" in response:
        return "quick"
    if "<code>" not in response and "<answer>" in response:
        return "guess"
    return "other"
