"""Scripted SFT plans: the guess and wrong-measure shares are what the config asks for."""

import numpy as np
import pytest

from pyvision_jax.data import synthetic
from pyvision_jax.data.sft_solutions import RESULT_SLOT, solution_plan
from pyvision_jax.data.tasks import load_tasks


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    files = synthetic.generate_synthetic_suite(tmp_path_factory.mktemp("plans"), 2, 5, ("counting", "visual_search"))
    return [task for file in files.values() for task in load_tasks(file).tasks]


def _plans(tasks, draws, **shares):
    return [
        solution_plan(task, np.random.default_rng([t, k]), **shares)
        for t, task in enumerate(tasks)
        for k in range(draws)
    ]


def test_guesses_answer_in_one_turn_without_code_and_code_plans_read_the_result(tasks):
    guesses = _plans(tasks, 3, guess_share=1.0, wrong_share=0.0)
    assert all(
        p.strategy == "guess" and p.imperfect and len(p.turns) == 1 and "<code>" not in p.turns[0] for p in guesses
    )
    code = _plans(tasks, 3, guess_share=0.0, wrong_share=0.0)
    assert all(not p.imperfect and "<code>" in p.turns[-2] and RESULT_SLOT in p.turns[-1] for p in code)
    wrong = _plans(tasks, 3, guess_share=0.0, wrong_share=1.0)
    assert all(p.strategy.endswith("/wrong") for p in wrong)


def test_the_guess_share_is_drawn_per_plan(tasks):
    plans = _plans(tasks, 100, guess_share=0.5, wrong_share=0.1)
    guessed = np.mean([p.strategy == "guess" for p in plans])
    wrong = np.mean([p.strategy.endswith("/wrong") for p in plans])
    assert 0.42 < guessed < 0.58 and 0.05 < wrong < 0.15


def test_shares_that_add_up_to_more_than_all_plans_are_refused(tasks):
    with pytest.raises(ValueError, match="sum <= 1"):
        solution_plan(tasks[0], np.random.default_rng(0), guess_share=0.7, wrong_share=0.4)
