"""The pure parts of the learning results: plan shares, evaluation summaries, the temperature
choice and seed checks (experiments/baselines.py), early stopping, per-run statistics, tool-call
ratios and the claim checks (experiments/dynamics_stats.py)."""

import json

import pytest

from experiments.baselines import EvalSet, TemperatureBaselines, best_temperature, check_validation_seed
from experiments.dynamics_stats import (
    OVER_SEEDS,
    adaptivity_checks,
    claim_checks,
    early_stop_step,
    run_statistics,
    tool_call_ratios,
)
from experiments.eval_summary import EvalSummary
from experiments.fixed_policies import FixedPolicy
from pyvision_jax.eval.plan_shares import family_of, mean_shares, plan_shares, response_text
from pyvision_jax.run_logs import metric_names as tags

QUICK = "A quick glance.\n<code>\nquick()\n</code>"
CAREFUL = ["<code>\nlook()\n</code>", "<code>\nmeasure()\n</code>", "<answer>red square</answer>"]
GUESS = "I can answer directly.\n<answer>A</answer>"
PLANS_EVEN = {"quick": 0.25, "careful": 0.25, "guess": 0.25, "other": 0.25}


def summary(per_task, tool_calls=1.0, plans=PLANS_EVEN):
    accuracy = sum(per_task.values()) / len(per_task)
    return EvalSummary(accuracy, tool_calls, per_task, plans, 2 * len(per_task), "/x")


def test_plan_shares_read_every_turn_of_a_response():
    record = {"turns": [{"text": t} for t in CAREFUL]}
    assert response_text(record).splitlines()[1] == "look()"
    shares = plan_shares([response_text(record), QUICK, QUICK, GUESS, "no code, no answer"])
    assert shares == {"quick": 0.4, "careful": 0.2, "guess": 0.2, "other": 0.2}
    assert mean_shares([shares, PLANS_EVEN])["quick"] == pytest.approx(0.325)
    with pytest.raises(ValueError, match="no responses"):
        plan_shares([])


def test_eval_summary_from_an_evaluation_directory(tmp_path):
    records = [
        {"task_id": "a", "correct": True, "turns": [{"text": QUICK}, {"text": "<answer>x</answer>"}]},
        {"task_id": "a", "correct": False, "turns": [{"text": GUESS}]},
        {"task_id": "b", "correct": True, "turns": [{"text": t} for t in CAREFUL], "grading_failed": False},
        {"task_id": "b", "correct": True, "turns": [{"text": GUESS}], "grading_failed": True},
    ]
    records[0]["task"] = records[1]["task"] = {"ability": "shapes_easy"}
    records[2]["task"] = records[3]["task"] = {"ability": "shapes_hard"}
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    results = {"complete": True, "accuracy": 0.75, "tool_calls": {"mean": 1.0}, "num_rollouts": 4, "pass_at_k": 1.0}
    (tmp_path / "results.json").write_text(json.dumps(results))
    got = EvalSummary.from_dir(tmp_path)
    assert got.per_task == {"a": 0.5, "b": 1.0}  # the rollout whose grading failed is left out
    assert got.plans == {"quick": 0.25, "careful": 0.25, "guess": 0.5, "other": 0.0}
    assert list(got.plans_by_ability) == ["shapes_easy", "shapes_hard"]
    assert got.plans_by_ability["shapes_easy"] == {"quick": 0.5, "careful": 0.0, "guess": 0.5, "other": 0.0}
    assert got.plans_by_ability["shapes_hard"] == {"quick": 0.0, "careful": 0.5, "guess": 0.5, "other": 0.0}
    assert got.accuracy_by_ability == {"shapes_easy": 0.5, "shapes_hard": 1.0}
    entry = got.as_dict(per_task=True)
    assert entry["plans_by_ability"]["shapes_hard"]["careful"] == 0.5
    assert entry["accuracy_by_ability"] == {"shapes_easy": 0.5, "shapes_hard": 1.0}
    assert entry["plans_by_family"] == entry["plans_by_ability"] and entry["accuracy_by_family"] == {
        "shapes_easy": 0.5,
        "shapes_hard": 1.0,
    }
    assert entry["accuracy"] == 0.75 and entry["per_task"] == {"a": 0.5, "b": 1.0} and entry["out_dir"] == str(tmp_path)
    assert entry["accuracy_ci95"][0] <= 0.75 <= entry["accuracy_ci95"][1]
    (tmp_path / "results.json").write_text(json.dumps({**results, "complete": False}))
    with pytest.raises(ValueError, match="not complete"):
        EvalSummary.from_dir(tmp_path)


def test_best_temperature_is_chosen_on_validation_first_among_equals():
    assert best_temperature([(0.1, 0.2), (0.3, 0.5), (0.6, 0.5), (1.0, 0.4)]) == 0.3
    assert best_temperature([(1.0, 0.0)]) == 1.0
    validation = {0.3: summary({"a": 0.0, "b": 0.5}), 1.0: summary({"a": 1.0, "b": 0.5})}
    heldout = {0.3: summary({"c": 1.0, "d": 1.0}), 1.0: summary({"c": 0.0, "d": 0.5})}
    sets = EvalSet("validation", 777, 1, 2), EvalSet("heldout", 4242, 1, 2)
    baselines = TemperatureBaselines(*sets, validation, heldout)
    assert baselines.best_temperature == 1.0 and baselines.best is heldout[1.0]  # never the held-out's best (0.3)
    record = baselines.as_dict()
    assert record["best_heldout_accuracy"] == 0.25 and [e["seed"] for e in record["heldout"]] == [4242, 4242]
    with pytest.raises(ValueError, match="same non-empty list"):
        TemperatureBaselines(baselines.validation_set, baselines.heldout_set, validation, {0.3: heldout[0.3]})


def test_validation_seed_checks():
    check_validation_seed(777, 4242, {"data.synthetic_seed": 0, "sft.synthetic_seed": 1000})
    with pytest.raises(ValueError, match="must differ from the held-out seed 4242"):
        check_validation_seed(4242, 4242, {})
    with pytest.raises(ValueError, match="training seed sft.synthetic_seed=1000"):
        check_validation_seed(1000, 4242, {"sft.synthetic_seed": 1000})
    with pytest.raises(ValueError, match="data.synthetic_seed=4242 must differ from the held-out seed"):
        check_validation_seed(777, 4242, {"data.synthetic_seed": 4242})


def test_early_stopping_takes_the_best_validation_step_earliest_among_equals():
    assert early_stop_step({0: 0.2, 2: 0.5, 4: 0.5, 6: 0.4}) == 2
    assert early_stop_step({4: 0.1, 0: 0.1}) == 0
    with pytest.raises(ValueError, match="at least one"):
        early_stop_step({})


def test_run_statistics_report_the_held_out_result_at_the_validation_choice():
    validation = {0: summary({"v": 0.0}), 2: summary({"v": 1.0}), 4: summary({"v": 0.5})}
    careful = {"quick": 0.0, "careful": 1.0, "guess": 0.0, "other": 0.0}
    heldout = {
        0: summary({"a": 0.0, "b": 0.5}, tool_calls=1.0),
        2: summary({"a": 0.5, "b": 0.5}, tool_calls=1.5, plans=careful),
        4: summary({"a": 1.0, "b": 1.0}, tool_calls=2.0),  # the held-out best: never chosen
    }
    baseline = summary({"a": 0.0, "b": 0.0})
    curves = {tags.TOOLS_CALLS_PER_TRAJ: [(1, 1.1), (4, 1.9)]}
    stats = run_statistics(validation, heldout, baseline, curves)
    assert stats["early_stop_step"] == 2 and stats["validation_at_early_stop"] == 1.0
    assert stats["heldout_early_stopped"]["accuracy"] == 0.5 and stats["heldout_early_stopped"]["step"] == 2
    assert stats["heldout_last"] == {"step": 4, "accuracy": 1.0, "ci95": [1.0, 1.0]}
    assert stats["early_stopped_minus_baseline"]["estimate"] == pytest.approx(0.5)
    assert stats["early_stopped_minus_baseline"]["ci95"] == [0.5, 0.5]  # both tasks gained 0.5
    assert stats["last_minus_start"]["estimate"] == pytest.approx(0.75)
    assert stats["tool_calls"] == {
        "heldout_start": 1.0,
        "heldout_early_stopped": 1.5,
        "heldout_last": 2.0,
        "train_first": 1.1,
        "train_last": 1.9,
    }
    assert stats["plans"]["early_stopped"] == careful and stats["plans"]["start"] == PLANS_EVEN
    with pytest.raises(ValueError, match="must match and include 0"):
        run_statistics({2: validation[2]}, {2: heldout[2]}, baseline, curves)


def fake_stats(gain, gain_ci, change, calls_start, calls_end, train_last=1.0):
    return {
        "early_stopped_minus_baseline": {"estimate": gain, "ci95": gain_ci},
        "last_minus_start": {"estimate": change, "ci95": [change - 0.1, change + 0.1]},
        "tool_calls": {"heldout_start": calls_start, "heldout_last": calls_end, "train_last": train_last},
    }


def test_tool_call_ratios_and_claim_checks_per_seed():
    by_run = {
        ("full", 0): fake_stats(0.12, [0.02, 0.2], 0.1, 1.0, 2.0, train_last=2.0),
        ("no_tool_reward", 0): fake_stats(0.0, [-0.1, 0.1], 0.0, 1.0, 1.2, train_last=0.5),
        ("random_reward", 0): fake_stats(0.0, [-0.1, 0.1], -0.02, 1.0, 1.0),
        ("full", 1): fake_stats(0.15, [-0.01, 0.3], 0.1, 1.0, 0.0, train_last=0.0),
        ("no_tool_reward", 1): fake_stats(0.0, [-0.1, 0.1], 0.0, 1.0, 0.0),
        ("random_reward", 1): fake_stats(0.0, [-0.1, 0.1], 0.05, 1.0, 1.0),
    }
    ratios = tool_call_ratios(by_run)
    assert ratios["no_tool_reward", 0] == {"heldout_last": pytest.approx(0.6), "train_last": 0.25}
    assert ratios["full", 0] == {"heldout_last": 1.0, "train_last": 1.0}
    assert ratios["no_tool_reward", 1] == {"heldout_last": None, "train_last": None}  # full's are 0
    checks = claim_checks(by_run)
    assert list(checks) == ["seed_0", "seed_1", OVER_SEEDS]
    over = checks[OVER_SEEDS]  # the means over seeds 0 and 1
    assert over["full_tool_calls"] == {"seeds": [0, 1], "start": 1.0, "end": 1.0, "seeds_passed": 1, "passed": True}
    assert over["no_tool_reward"]["end_tool_calls"] == pytest.approx(0.6)
    assert over["no_tool_reward"]["ratio"] == pytest.approx(0.6) and over["no_tool_reward"]["seeds_passed"] == 2
    assert over["passed"]
    collapsed = claim_checks({**by_run, ("no_tool_reward", 1): fake_stats(0.0, [-0.1, 0.1], 0.0, 1.0, 0.8)})
    assert collapsed[OVER_SEEDS]["no_tool_reward"]["ratio"] == pytest.approx(1.0)
    assert not collapsed[OVER_SEEDS]["no_tool_reward"]["passed"] and not collapsed[OVER_SEEDS]["passed"]
    assert collapsed[OVER_SEEDS]["no_tool_reward"]["seeds_passed"] == 1
    seed0, seed1 = checks["seed_0"], checks["seed_1"]
    assert seed0["full_gain"]["passed"] and seed0["full_tool_calls"]["passed"]
    assert seed0["random_reward"]["passed"] and seed0["no_tool_reward"]["passed"] and seed0["passed"]
    assert not seed1["full_gain"]["passed"] and not seed1["full_gain"]["ci_low_above_0"]  # CI reaches below 0
    assert not seed1["full_tool_calls"]["passed"] and not seed1["random_reward"]["passed"]
    assert seed1["no_tool_reward"]["passed"] and seed1["passed"] is False
    low_gain = claim_checks({("full", 0): fake_stats(0.08, [0.01, 0.15], 0.0, 1.0, 1.0)})["seed_0"]
    assert low_gain["full_gain"]["ci_low_above_0"] and not low_gain["full_gain"]["passed"]  # below 0.10
    assert claim_checks({("std_norm", 3): fake_stats(0.0, [0.0, 0.0], 0.0, 1.0, 1.0)}) == {"seed_3": {"passed": None}}


def test_a_shapes_family_drops_the_variant_suffixes():
    assert [family_of(a) for a in ("shapes_easy_speck", "shapes_hard_tilted", "shapes_hard", "counting")] == [
        "shapes_easy",
        "shapes_hard",
        "shapes_hard",
        "counting",
    ]


def test_adaptivity_checks_need_the_gain_over_the_input_independent_policy_and_plans_by_family():
    best = FixedPolicy("plan careful", {"v": 1.0}, {"a": 1.0, "b": 0.0, "c": 0.0}, {})
    run = summary({"a": 1.0, "b": 1.0, "c": 0.0})
    gain = best.gain_of(run)
    assert gain["baseline"] == "plan careful" and gain["estimate"] == pytest.approx(1 / 3)
    guess = {"quick": 0.0, "careful": 0.3, "guess": 0.7, "other": 0.0}
    careful = {"quick": 0.0, "careful": 0.6, "guess": 0.4, "other": 0.0}
    stats = {
        "early_stopped_minus_input_independent": gain,
        "plans_by_family": {"early_stopped": {"shapes_easy": guess, "shapes_hard": careful}},
    }
    checks = adaptivity_checks(stats)
    assert checks["input_independent_gain"]["passed"] == (gain["ci95"][0] > 0)
    assert checks["plans_by_family"]["passed"]
    assert checks["plans_by_family"]["best_plan_share"] == {"shapes_easy guess": 0.7, "shapes_hard careful": 0.6}
    stats["plans_by_family"]["early_stopped"]["shapes_easy"] = careful  # the same plans on every family
    assert not adaptivity_checks(stats)["plans_by_family"]["passed"]
    small = {"baseline": "x", "estimate": 0.04, "ci95": [0.01, 0.07]}
    assert not adaptivity_checks({"early_stopped_minus_input_independent": small})["input_independent_gain"]["passed"]
    assert adaptivity_checks({}) == {}
