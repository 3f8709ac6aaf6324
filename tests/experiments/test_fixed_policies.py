"""The input-independent baselines: constant answers, plans forced on every task through the real
episode code and sandbox (the adaptive toy's config, a few tasks), and the best of each kind
chosen on validation."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from configs import shapes_adaptive_cpu
from experiments.baselines import EvalSet, TemperatureBaselines
from experiments.fixed_policies import (
    FORCED_PLANS,
    FixedPolicy,
    abilities_of,
    best_of,
    constant_answer,
    evaluate_forced_plan,
    evaluated,
    fixed_policy_baselines,
    input_independent_baselines,
)
from experiments.plan_accuracy import Cell, careful_right, helper_reading
from pyvision_jax.data.drawing import COLOURS
from pyvision_jax.data.shape_plans import scripted_plan
from pyvision_jax.data.synthetic import generate_synthetic_suite
from pyvision_jax.data.tasks import load_tasks

KIND = "shapes_adaptive"


@pytest.fixture(scope="module")
def forced(tmp_path_factory):
    """Each plan forced on 6 tasks of two seeds (neither of them a held-out seed of the docs)."""
    root = tmp_path_factory.mktemp("forced")
    config = shapes_adaptive_cpu.get_config()
    sets = {}
    for name, seed in (("validation", 5), ("heldout", 6)):
        path = generate_synthetic_suite(root / name / "tasks", 6, seed, (KIND,))[KIND]
        summaries = {plan: evaluate_forced_plan(config, path, root / name / plan, plan) for plan in FORCED_PLANS}
        sets[name] = (load_tasks(path).tasks, summaries)
    return sets


def test_a_forced_plan_is_followed_on_every_task_and_answers_as_its_helpers(forced):
    reading = helper_reading()
    for tasks, summaries in forced.values():
        for plan, summary in summaries.items():
            assert summary.plans[plan] == 1.0 and summary.num_rollouts == len(tasks)
        for task in tasks:
            colour, shape = task.options["ABCD".index(task.answer)].split()
            cell = Cell(task.ability, shape, colour, Fraction(1))
            assert summaries["careful"].per_task[task.id] == careful_right(cell, reading), task.id
            assert summaries["guess"].per_task[task.id] == (task.answer == "A")
            if sum(COLOURS[colour]) % 3 == 0:  # quick() prints "A" on purple objects
                assert summaries["quick"].per_task[task.id] == (task.answer == "A")
        assert set(summaries["careful"].accuracy_by_ability) == {t.ability for t in tasks}


def test_the_best_input_independent_baseline_is_chosen_on_validation(forced):
    (validation, v_runs), (heldout, h_runs) = forced["validation"], forced["heldout"]
    abilities = abilities_of(validation, heldout)
    constants = [constant_answer(a, validation, heldout) for a in "ABCD"]
    assert constants[0].heldout == h_runs["guess"].per_task and set(constants[3].heldout.values()) == {0.0}
    plans = [evaluated(f"plan {p}", v_runs[p], h_runs[p], abilities) for p in FORCED_PLANS]
    report = input_independent_baselines(constants, plans, plans[:1])
    best_plan = max(plans, key=lambda p: p.validation_accuracy)
    assert report["best_mixture"]["validation_accuracy"] == best_plan.validation_accuracy
    assert report["best_constant"]["name"] == "answer A"
    best = report["best_input_independent"]
    assert best["validation_accuracy"] == max(p.validation_accuracy for p in constants + plans)
    assert best["heldout_accuracy_ci95"][0] <= best["heldout_accuracy"] <= best["heldout_accuracy_ci95"][1]
    assert set(best["heldout_accuracy_by_ability"]) == {t.ability for t in heldout}
    assert [p["name"] for p in report["forced_plans"]] == ["plan quick", "plan careful", "plan guess"]
    assert all(shares["careful"] == 1.0 for shares in report["forced_plans"][1]["plans_by_ability"].values())
    gain = plans[0].gain_of(h_runs["careful"])
    assert gain["baseline"] == "plan quick"
    assert gain["estimate"] == pytest.approx(h_runs["careful"].accuracy - h_runs["quick"].accuracy)
    assert gain["ci95"][0] <= gain["estimate"] <= gain["ci95"][1]


def test_ties_go_to_the_first_listed_and_bad_input_is_named():
    one = FixedPolicy("one", {"a": 1.0, "b": 0.0}, {"a": 1.0}, {"a": "x"})
    assert best_of([one, dataclasses.replace(one, name="two")]).name == "one"
    assert best_of([one, dataclasses.replace(one, name="two", validation={"a": 1.0})]).name == "two"
    with pytest.raises(ValueError, match="best of no fixed policies"):
        best_of([])
    with pytest.raises(ValueError, match="unknown shapes plan 'slow'"):
        scripted_plan("slow")


def test_a_constant_answer_scores_multiple_choice_tasks_only(forced):
    tasks = forced["validation"][0]
    numeric = dataclasses.replace(tasks[0], answer_type="numeric", answer="3")
    with pytest.raises(ValueError, match=f"task {tasks[0].id} is numeric"):
        constant_answer("A", [numeric], tasks)


def test_a_configs_sets_get_every_kind_of_input_independent_baseline(forced, tmp_path):
    (_, v_runs), (_, h_runs) = forced["validation"], forced["heldout"]
    validation, heldout = EvalSet("validation", 5, 6, 1), EvalSet("heldout", 6, 6, 1)
    temperatures = TemperatureBaselines(validation, heldout, {1.0: v_runs["quick"]}, {1.0: h_runs["quick"]})
    policies = fixed_policy_baselines(shapes_adaptive_cpu.get_config(), tmp_path, validation, heldout, temperatures)
    report = policies.as_dict()
    assert (tmp_path / "baselines" / "forced" / "seed_6" / "careful" / "results.json").is_file()
    assert [p["name"] for p in report["constants"]] == ["answer A", "answer B", "answer C", "answer D"]
    assert [p["heldout_accuracy"] for p in report["forced_plans"]] == [h_runs[p].accuracy for p in FORCED_PLANS]
    assert report["best_temperature"]["name"] == "T 1" and report["temperatures"][0]["plans"]["quick"] == 1.0
    names = {report[key]["name"] for key in ("best_constant", "best_mixture", "best_temperature")}
    assert report["best_input_independent"]["name"] in names
    assert report["best_input_independent"]["name"] == policies.best.name
    careful = report["forced_plans"][1]
    assert set(careful["plans_by_family"]) == {"shapes_easy", "shapes_hard"}
    assert all(shares["careful"] == 1.0 for shares in careful["plans_by_family"].values())
