"""The ablation variants (experiments/ablations.py), their figures and tables, and
`python -m experiments.reproduce_dynamics` end to end on the tiny random-init model (two temperatures,
two variants of two steps, evaluated at the start and the end) and its refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from PIL import Image

from experiments.ablations import (
    CONTROL,
    CURVES,
    HELDOUT_ACCURACY,
    VALIDATION_ACCURACY,
    VARIANTS,
    Variant,
    eval_points,
    log_evaluations,
    read_curves,
)
from experiments.baselines import EvalSet, TemperatureBaselines
from experiments.dynamics_figures import (
    PLAN_COLOURS,
    mean_curve,
    plot_dynamics,
    plot_plans,
    plot_plans_by_family,
    stacked_plan_bar,
)
from experiments.dynamics_runs import variant_config
from experiments.dynamics_stats import VariantRun, claim_checks, early_stop_step, run_records, statistics_by_run
from experiments.dynamics_tables import results_markdown, results_table
from experiments.eval_summary import EvalSummary
from pyvision_jax.run_logs import metric_names as tags
from tests.eval.tiny_run import TINY
from tests.tiny_random_cpu import get_config
from tests.train.compilation_cache import COMPILATION_CACHE

ROOT = Path(__file__).resolve().parents[2]


def test_variants_change_one_switch_each_and_leave_the_base_config_alone():
    config = get_config()
    for variant in VARIANTS.values():
        changed = variant_config(config, variant)
        for key, value in variant.overrides.items():
            section, field = key.split(".")
            assert changed[section][field] == value and config[section][field] != value
    assert variant_config(config, VARIANTS["full"]).to_dict() == config.to_dict()
    assert [name for name, v in VARIANTS.items() if v.kind == CONTROL] == ["random_reward", "entropy_min"]
    assert variant_config(config, VARIANTS["entropy_min"]).rl.entropy_coef < 0
    with pytest.raises(ValueError, match="kind must be one of"):
        Variant("bad", {}, "", kind="baseline")
    with pytest.raises(ValueError, match="'rl.tool_reward' is not a config field"):
        variant_config(config, Variant("bad", {"rl.tool_reward": 0.0}, ""))


def test_eval_points_include_the_last_step():
    assert eval_points(10, 4) == [4, 8, 10]
    assert eval_points(3, 5) == [3]
    with pytest.raises(ValueError, match="eval_every"):
        eval_points(3, 0)


def summary(per_task, tool_calls=1.0, careful=0.25):
    plans = {"quick": 0.75 - careful, "careful": careful, "guess": 0.25, "other": 0.0}
    by_ability = {"shapes_easy": {**plans, "careful": 0.0, "guess": 0.25 + careful}, "shapes_hard": plans}
    return EvalSummary(
        sum(per_task.values()) / len(per_task),
        tool_calls,
        per_task,
        plans,
        len(per_task),
        "/x",
        plans_by_ability=by_ability,
        accuracy_by_ability={"shapes_easy": 1.0 - careful, "shapes_hard": careful},
    )


def fake_run(name, seed, accuracy_end, calls):
    steps = range(1, len(calls) + 1)
    curves = {tag: [(s, float(s)) for s in steps] for tag in CURVES}
    curves[tags.TOOLS_CALLS_PER_TRAJ] = list(zip(steps, calls))
    curves[HELDOUT_ACCURACY] = [(0, 0.25), (len(calls), accuracy_end)]
    last = len(calls)
    return VariantRun(
        VARIANTS[name],
        seed,
        f"/runs/{name}/seed_{seed}",
        validation={0: summary({"v": 0.0}), last: summary({"v": 1.0})},
        heldout={
            0: summary({"a": 0.0, "b": 0.5}),
            last: summary({"a": accuracy_end, "b": accuracy_end}, calls[-1], careful=0.5),
        },
        curves=curves,
        wall_time_s=12.0,
    )


def test_evaluations_are_logged_once_per_step_unless_they_change(tmp_path):
    """A rerun that reuses an evaluation writes no second event; a changed one is rewritten."""
    tb_dir = tmp_path / "tb"
    first = {"heldout": summary({"a": 0.5}, tool_calls=1.25), "validation": summary({"v": 0.75})}
    log_evaluations(tb_dir, 12, first)
    files = sorted(tb_dir.iterdir())
    log_evaluations(tb_dir, 12, first)
    assert sorted(tb_dir.iterdir()) == files
    log_evaluations(tb_dir, 12, {**first, "heldout": summary({"a": 0.25}, tool_calls=1.25)})
    log_evaluations(tb_dir, 24, first)
    curves = read_curves(tb_dir)
    assert curves[HELDOUT_ACCURACY] == [(12, 0.25), (24, 0.5)]
    assert curves["heldout/tool_calls"] == [(12, 1.25), (24, 1.25)]
    assert curves[VALIDATION_ACCURACY] == [(12, 0.75), (24, 0.75)]


def test_a_stacked_plan_bar_stacks_every_plan_in_order_an_absent_one_at_zero():
    axis = Figure().subplots()
    stacked_plan_bar(axis, 2.0, {"careful": 0.25, "quick": 0.5, "other": 0.125}, legend=True)
    bars = axis.patches
    assert [(b.get_x() + b.get_width() / 2, b.get_y(), b.get_height()) for b in bars] == [
        (2.0, 0.0, 0.5),
        (2.0, 0.5, 0.25),
        (2.0, 0.75, 0.0),
        (2.0, 0.75, 0.125),
    ]
    assert [c.get_label() for c in axis.containers] == ["quick", "careful", "guess", "other"]
    assert [b.get_facecolor() for b in bars] == [
        to_rgba(PLAN_COLOURS[p]) for p in ("quick", "careful", "guess", "other")
    ]
    stacked_plan_bar(axis, 3.0, {"guess": 1.0}, legend=False)
    assert not any(c.get_label() in PLAN_COLOURS for c in axis.containers[4:])
    assert axis.patches[6].get_height() == 1.0


def test_figures_and_tables(tmp_path):
    runs = [
        fake_run("full", 0, 0.5, [1.0, 1.2, 1.4, 1.6]),
        fake_run("full", 1, 0.75, [1.0, 1.1, 1.2, 1.3]),
        fake_run("no_tool_reward", 0, 0.25, [1.0, 0.6, 0.2, 0.0]),
        fake_run("random_reward", 0, 0.5, [1.0, 1.0, 1.0, 1.0]),
    ]
    records = run_records(runs, baseline=summary({"a": 0.0, "b": 0.25}))
    plot_dynamics(records, tmp_path / "f.png", title="t", baseline=0.125, start=0.25)
    image = np.asarray(Image.open(tmp_path / "f.png"))
    assert image.shape[:2] == (800, 1500) and image.std() > 10
    records[0]["curves"][tags.param_mean_tag("model/norm/scale")] = [(1, 1.3), (2, 1.5)]
    plot_dynamics(records, tmp_path / "with_params.png")
    assert np.asarray(Image.open(tmp_path / "with_params.png")).shape[:2] == (800, 2000)  # a 2 x 4 grid
    plot_plans(records, tmp_path / "plans.png", title="t")
    assert np.asarray(Image.open(tmp_path / "plans.png")).std() > 10
    assert not plot_plans_by_family(records, tmp_path / "by_family.png")  # one family: no figure
    assert not (tmp_path / "by_family.png").exists()
    shares = {"easy": {"quick": 0.5, "guess": 0.5}, "hard": {"careful": 1.0}}
    for record in records:
        record["statistics"]["plans_by_family"] = {"start": shares, "early_stopped": shares, "last": shares}
    assert plot_plans_by_family(records, tmp_path / "by_family.png", title="t")
    assert np.asarray(Image.open(tmp_path / "by_family.png")).std() > 10
    assert mean_curve([[(1, 1.0), (2, 2.0)], [(2, 4.0), (3, 1.0)]]) == [(2, 3.0)]
    table = results_table(records).splitlines()
    assert table[0] == "### Recipe and ablations" and table[8] == "### Controls"
    assert table[4] == (
        "| full | 0 | 0.250 [0.000, 0.500] | 0.500 [0.500, 0.500] (4) | 0.500 [0.500, 0.500] | "
        "+0.375 [+0.250, +0.500] | +0.250 [+0.000, +0.500] | 1.00 -> 1.60 | 1.00 | 0.25 -> 0.50 | 12 | "
        f"{VARIANTS['full'].paper} |"
    )
    assert table[6].startswith("| no_tool_reward | 0 | ") and "| 1.00 -> 0.00 | 0.00 |" in table[6]
    assert table[12].startswith("| random_reward | 0 | ") and len(table) == 13
    checks = claim_checks(statistics_by_run(records))
    assert checks["seed_0"]["full_gain"]["passed"] and checks["seed_0"]["no_tool_reward"]["passed"]
    assert not checks["seed_0"]["random_reward"]["passed"]  # tasks a, b: 0 -> 0.5, 0.5 -> 0.5
    assert list(checks["seed_1"]) == ["full_gain", "full_tool_calls", "passed"]
    markdown = results_markdown(records, baselines_record(), checks, 777, 4242)
    assert markdown.startswith("Best fixed temperature T 0.6 (chosen on validation seed 777): held-out (seed 4242)")
    assert "- seed_0 random_reward: FAIL (last_minus_start 0.250, max_change 0.030)" in markdown
    assert (
        "| variant | seed | shapes_easy: start -> end (accuracy) | shapes_hard: start -> end (accuracy) |" in markdown
    )
    assert (
        "| full | 0 | 0.50 / 0.00 / 0.50 (0.75) -> 0.25 / 0.00 / 0.75 (0.50) | "
        "0.50 / 0.25 / 0.25 (0.25) -> 0.25 / 0.50 / 0.25 (0.50) |" in markdown
    )


def baselines_record():
    validation = {t: summary({"v": a}) for t, a in ((0.3, 0.0), (0.6, 1.0))}
    heldout = {t: summary({"a": a, "b": 0.0}) for t, a in ((0.3, 1.0), (0.6, 0.5))}
    return TemperatureBaselines(
        EvalSet("validation", 777, 1, 1), EvalSet("heldout", 4242, 2, 1), validation, heldout
    ).as_dict()


def script_env():
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )


def tiny_command(workdir, *flags):
    return [
        sys.executable,
        "-m",
        "experiments.reproduce_dynamics",
        f"--workdir={workdir}",
        "--config",
        str(ROOT / "tests" / "tiny_random_cpu.py"),
        *TINY,
        "--config.data.synthetic_kinds=('counting',)",
        "--config.eval.heldout_per_kind=1",
        "--config.eval.heldout_k=1",
        "--config.eval.max_new_tokens_per_turn=8",
        *flags,
    ]


def test_reproduce_dynamics_end_to_end(tmp_path):
    """The two runs trained side by side (--jobs 2), then the same command one run after the
    other, which reuses every step and evaluation and reports the same results."""
    flags = (
        "--steps=2",
        "--eval-every=2",
        "--variants=full,random_reward",
        "--temperatures=0.5,1.0",
        "--validation-per-kind=2",
    )
    command = tiny_command(tmp_path, *flags, "--jobs=2")
    result = subprocess.run(command, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in ("full", "random_reward"):
        assert f"{name} seed 0: finished in" in result.stdout
        run_log = (tmp_path / name / "seed_0" / "reproduce.log").read_text()
        assert f"{name} seed 0: step 2: validation accuracy" in run_log
        assert (tmp_path / name / "seed_0" / "jax_cache").is_dir()  # a compilation cache of its own
    side_by_side = json.loads((tmp_path / "results.json").read_text())
    command = tiny_command(tmp_path, *flags)
    result = subprocess.run(command, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("baselines", "start", "runs", "claims"):
        assert results[key] == side_by_side[key], key
    baselines = results["baselines"]
    assert baselines["temperatures"] == [0.5, 1.0]
    assert {e["seed"] for e in baselines["validation"]} == {777} and {e["seed"] for e in baselines["heldout"]} == {4242}
    accuracies = [e["accuracy"] for e in baselines["validation"]]  # chosen on validation, the first among equals
    best = baselines["best_temperature"]
    assert best == baselines["validation"][accuracies.index(max(accuracies))]["temperature"]
    assert (
        baselines["best_heldout_accuracy"]
        == next(e for e in baselines["heldout"] if e["temperature"] == best)["accuracy"]
    )
    assert results["start"]["temperature"] == 1.0  # eval.temperature: the baseline's evaluation at 1.0 reused
    assert results["start"]["heldout"]["out_dir"] == str(tmp_path / "baselines" / "seed_4242" / "T_1")
    assert [(run["name"], run["kind"], run["seed"]) for run in results["runs"]] == [
        ("full", "recipe", 0),
        ("random_reward", "control", 0),
    ]
    for run in results["runs"]:
        assert sorted(run["heldout"], key=int) == sorted(run["validation"], key=int) == ["0", "2"]
        assert [s for s, _ in run["curves"][tags.REWARD_ACCURACY]] == [1, 2]
        assert [s for s, _ in run["curves"][HELDOUT_ACCURACY]] == [0, 2]
        assert [s for s, _ in run["curves"][VALIDATION_ACCURACY]] == [0, 2]
        stats = run["statistics"]
        chosen = early_stop_step({int(s): e["accuracy"] for s, e in run["validation"].items()})
        assert stats["early_stop_step"] == chosen
        assert stats["heldout_early_stopped"]["accuracy"] == run["heldout"][str(chosen)]["accuracy"]
        assert stats["heldout_last"]["step"] == 2 and sum(stats["plans"]["last"].values()) == pytest.approx(1.0)
        low, high = stats["early_stopped_minus_baseline"]["ci95"]
        assert low <= stats["early_stopped_minus_baseline"]["estimate"] <= high
        run_dir = tmp_path / run["name"] / "seed_0"
        assert run["run_dir"] == str(run_dir) and run["wall_time_s"] > 0
        for name in ("validation", "heldout"):
            assert (run_dir / name / "step_2" / "results.json").is_file()
    config = json.loads((tmp_path / "random_reward" / "seed_0" / "config.json").read_text())
    assert config["rl"]["reward_control"] == "random" and config["seed"] == 0
    assert (tmp_path / "validation" / "tasks" / "tasks.jsonl").read_text().count("counting-777-") == 2
    assert (tmp_path / "heldout" / "tasks" / "tasks.jsonl").read_text().count("counting-4242-") == 1
    assert results["validation"]["per_kind"] == 2 and results["heldout"]["per_kind"] == 1
    assert list(results["claims"]["seed_0"]) == [
        "full_gain",
        "full_tool_calls",
        "input_independent_gain",
        "random_reward",
        "passed",
    ]
    assert (tmp_path / "dynamics.png").stat().st_size > 10_000 and (tmp_path / "plans.png").stat().st_size > 5_000
    markdown = (tmp_path / "results.md").read_text()
    assert "### Controls" in markdown and "- seed_0 random_reward: " in markdown


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--validation-seed=4242"], "must differ from the held-out seed 4242"),
        (["--validation-seed=1000"], "must differ from the training seed sft.synthetic_seed=1000"),
        (["--seeds=0,1"], "a random-init start (model.hf_dir empty) depends on the seed"),
        (["--jobs=0"], "--jobs must be >= 1, got 0"),
        (["--validation-per-kind=-1"], "validation set: per_kind and k must be >= 1, got -1 and 1"),
    ],
)
def test_reproduce_dynamics_refuses_before_any_evaluation(tmp_path, flags, message):
    result = subprocess.run(
        tiny_command(tmp_path, *flags), cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0 and message in result.stderr
    assert not (tmp_path / "baselines").exists()
