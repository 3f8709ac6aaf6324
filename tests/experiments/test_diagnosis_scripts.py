"""`python -m experiments.temperature_baseline` end to end at tiny sizes and its seed refusals,
and the arithmetic of experiments.param_movement."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.param_movement import group_of, parameter_movement

REPO = Path(__file__).resolve().parents[2]


def test_parameter_movement_per_group_and_per_vocabulary_entry():
    before = {
        "lm_head/kernel": np.ones((2, 4)),
        "model/norm/scale": np.full(3, 2.0),
        "model/layers/mlp/up_proj/kernel": np.ones((2, 2)),
        "visual/patch_embed/proj/kernel": np.ones(5),
    }
    after = {name: value.copy() for name, value in before.items()}
    after["lm_head/kernel"][:, 1] += [0.3, 0.4]  # one token's output row moved by norm 0.5
    after["model/norm/scale"][0] = 3.0
    result = parameter_movement(before, after)
    groups = result["groups"]
    assert groups["lm_head"]["relative_update"] == pytest.approx(0.5 / np.sqrt(8))
    assert groups["lm_head"]["moved_share"] == pytest.approx(2 / 8)
    assert groups["norms"]["max_update"] == pytest.approx(1.0)
    assert groups["norms"]["relative_update"] == pytest.approx(1 / np.sqrt(12))
    assert groups["mlp"]["relative_update"] == groups["visual"]["relative_update"] == 0.0
    assert result["vocabulary_update_norm_quantiles"]["1"] == pytest.approx(0.5)
    assert result["vocabulary_update_norm_quantiles"]["0.5"] == 0.0
    assert [
        group_of(n)
        for n in (
            "model/embed_tokens/embedding",
            "model/layers/self_attn/q_proj/bias",
            "model/layers/input_layernorm/scale",
        )
    ] == ["embed", "attention", "norms"]
    with pytest.raises(ValueError, match="different parameters"):
        parameter_movement(before, {"lm_head/kernel": before["lm_head/kernel"]})


def temperature_baseline(workdir, *flags: str, timeout_s: int) -> subprocess.CompletedProcess:
    """`python -m experiments.temperature_baseline` on the tiny random-init model."""
    config = str(REPO / "tests" / "tiny_random_cpu.py")
    command = [sys.executable, "-m", "experiments.temperature_baseline", "--config", config, "--workdir", str(workdir)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([*command, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_temperature_baseline_at_tiny_sizes(tmp_path):
    result = temperature_baseline(
        tmp_path,
        "--temperatures",
        "0.5,1.0",
        "--per-kind",
        "1",
        "--k",
        "1",
        "--config.data.synthetic_kinds=('counting',)",
        "--config.eval.max_new_tokens_per_turn=8",
        "--config.eval.max_total_tokens=512",
        "--config.eval.max_tool_calls=1",
        timeout_s=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [e["temperature"] for e in results["validation"]] == [0.5, 1.0]
    assert {e["seed"] for e in results["validation"]} == {777}
    accuracies = [e["accuracy"] for e in results["validation"]]  # the most accurate, the first among equals
    assert results["best_temperature"] == results["validation"][accuracies.index(max(accuracies))]["temperature"]
    heldout = {e["temperature"]: e for e in results["heldout"]}
    assert set(heldout) == {results["best_temperature"], 1.0} and {e["seed"] for e in heldout.values()} == {4242}
    for e in results["validation"] + results["heldout"]:
        low, high = e["accuracy_ci95"]
        assert low <= e["accuracy"] <= high and e["num_rollouts"] == 1
        assert list(e["per_task"]) == [f"counting-{e['seed']}-0000"]
    low, high = results["heldout_best_minus_reference"]["ci95"]
    assert low <= results["heldout_best_minus_reference"]["difference"] <= high
    assert (tmp_path / "seed_777" / "T_0.5" / "results.json").is_file()
    assert results["validation"][0]["out_dir"] == str(tmp_path / "seed_777" / "T_0.5")
    assert sum(results["validation"][0]["plans"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "seed, message",
    [
        (4242, "must differ from the held-out seed 4242"),
        (0, "must differ from the training seed data.synthetic_seed=0"),
    ],
)
def test_temperature_baseline_refuses_a_heldout_or_training_validation_seed(tmp_path, seed, message):
    result = temperature_baseline(tmp_path, "--validation-seed", str(seed), timeout_s=300)
    assert result.returncode != 0 and message in result.stderr
    assert not list(tmp_path.iterdir())  # refused before any task or evaluation
