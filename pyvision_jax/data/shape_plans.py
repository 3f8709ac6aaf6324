"""Scripted plans of the "shapes" tasks (`data.shape_tasks`) and the plan a response follows.

Three plans, drawn per (task, draw) with seeded shares, so the SFT model's likeliest plan is
not its best one:

- quick (the rest of the shares): one call of `quick()` (a guessed letter), then its printed
  letter as the answer;
- careful (`careful_share`): `look()`, then `measure()`, then the measured letter;
- guess (`guess_share`): no tool call, the answer "A".

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


def scripted_plan(plan: str) -> SolutionPlan:
    """The scripted trajectory of one plan ("quick", "careful" or "guess"), the same on every task."""
    if plan == "guess":
        return SolutionPlan((f"{GUESS_THOUGHT}\n" + answer_turn("A"),), "shapes/guess", True)
    if plan == "careful":
        turns = (code_turn(LOOK_THOUGHT, "look()"), code_turn(MEASURE_THOUGHT, "measure()"), answer_turn(RESULT_SLOT))
        return SolutionPlan(turns, "shapes/careful", False)
    if plan == "quick":
        return SolutionPlan((code_turn(QUICK_THOUGHT, "quick()"), answer_turn(RESULT_SLOT)), "shapes/quick", True)
    raise ValueError(f"unknown shapes plan {plan!r}; expected one of {PLANS[:3]}")


def shape_plan(task: Task, rng: np.random.Generator, *, guess_share: float, careful_share: float) -> SolutionPlan:
    """One scripted trajectory of a shapes task (see the module docstring)."""
    if min(guess_share, careful_share) < 0 or guess_share + careful_share > 1:
        raise ValueError(f"guess_share {guess_share} and careful_share {careful_share} must be >= 0 with a sum <= 1")
    draw = float(rng.random())
    if draw < guess_share:
        return scripted_plan("guess")
    return scripted_plan("careful" if draw < guess_share + careful_share else "quick")


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
