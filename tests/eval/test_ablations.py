"""The ablation runner (eval/ablations.py), its figures, and benchmarks/reproduce_dynamics.py
end to end on the tiny random-init model (two variants, one step each)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.eval.ablations import CURVES, HELDOUT_ACCURACY, VARIANTS, Variant, eval_points
from pyvision_jax.eval.dynamics_figures import plot_dynamics, results_table
from pyvision_jax.train import metric_names as tags
from pyvision_jax.wiring.dynamics_runs import variant_config
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
    with pytest.raises(ValueError, match="'rl.tool_reward' is not a config field"):
        variant_config(config, Variant("bad", {"rl.tool_reward": 0.0}, ""))


def test_eval_points_include_the_last_step():
    assert eval_points(10, 4) == [4, 8, 10]
    assert eval_points(3, 5) == [3]
    with pytest.raises(ValueError, match="eval_every"):
        eval_points(3, 0)


def fake_run(name, accuracy_end, calls):
    steps = range(1, len(calls) + 1)
    curves = {tag: [(s, float(s)) for s in steps] for tag in CURVES}
    curves[tags.TOOLS_CALLS_PER_TRAJ] = list(zip(steps, calls))
    curves[HELDOUT_ACCURACY] = [(0, 0.2), (len(calls), accuracy_end)]
    return {
        "name": name,
        "paper": "p",
        "curves": curves,
        "heldout": {
            "0": {"accuracy": 0.2, "tool_calls": 1.0},
            str(len(calls)): {"accuracy": accuracy_end, "tool_calls": 1.0},
        },
    }


def test_figure_and_table(tmp_path):
    runs = [fake_run("full", 0.5, [1.0, 1.2, 1.4, 1.6]), fake_run("no_tool_reward", 0.25, [1.0, 0.6, 0.2, 0.0])]
    plot_dynamics(runs, tmp_path / "f.png", title="t")
    image = np.asarray(Image.open(tmp_path / "f.png"))
    assert image.shape[:2] == (800, 1500) and image.std() > 10
    runs[0]["curves"][tags.param_mean_tag("model/norm/scale")] = [(1, 1.3), (2, 1.5)]
    plot_dynamics(runs, tmp_path / "with_params.png")
    assert np.asarray(Image.open(tmp_path / "with_params.png")).shape[:2] == (800, 2000)  # a 2 x 4 grid
    table = results_table(runs).splitlines()
    assert table[2] == "| full | 0.200 | 0.500 | +30.0 | 1.00 | 1.60 | p |"
    assert table[3] == "| no_tool_reward | 0.200 | 0.250 | +5.0 | 1.00 | 0.00 | p |"


def test_reproduce_dynamics_end_to_end(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "reproduce_dynamics.py"),
        f"--workdir={tmp_path}",
        "--steps=2",
        "--eval-every=1",
        "--variants=full,no_tool_reward",
        "--config",
        str(ROOT / "tests" / "tiny_random_cpu.py"),
        *TINY,
        "--config.eval.heldout_per_kind=1",
        "--config.eval.heldout_k=1",
        "--config.eval.max_new_tokens_per_turn=8",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [run["name"] for run in results["runs"]] == ["full", "no_tool_reward"]
    for run in results["runs"]:
        assert sorted(run["heldout"], key=int) == ["0", "1", "2"]
        assert [s for s, _ in run["curves"][tags.REWARD_ACCURACY]] == [1, 2]
        assert [s for s, _ in run["curves"][HELDOUT_ACCURACY]] == [0, 1, 2]
        assert (tmp_path / run["name"] / "heldout" / "step_2" / "results.json").is_file()
    assert json.loads((tmp_path / "no_tool_reward" / "config.json").read_text())["rl"]["tool_reward_coef"] == 0.0
    assert (tmp_path / "dynamics.png").stat().st_size > 10_000
    assert (tmp_path / "results.md").read_text().count("\n") == 4
