"""The untrained baseline every RL result must beat: the config's model sampled at fixed
temperatures, the best chosen on a validation seed and reported on the held-out seed.

    python benchmarks/temperature_baseline.py --workdir /tmp/temperature_baseline \
        [--temperatures 0.1,0.3,0.6,1.0] [--per-kind 8] [--k 2] [--validation-seed 777] [--config.x=y ...]

Evaluates the config's own model (configs/tiny_cpu.py: the packaged SFT checkpoint) with the
ordinary evaluation (`wiring.evaluation.evaluate_checkpoint`) at every temperature on
`--per-kind` synthetic tasks of each kind of the validation seed, picks the most accurate
(ties: the first listed), and evaluates it and the recipe's sampling temperature
(rollout.temperature) on the same number of tasks of the held-out seed (eval.heldout_seed).
Nothing is chosen by the held-out seed. Accuracies come with 95 % bootstrap intervals over
tasks, and the held-out comparison with the paired interval of the difference. Writes
WORKDIR/results.json; every evaluation lies under WORKDIR/seed_<S>/T_<T> and a rerun reuses it.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from absl import app, flags
from ml_collections import config_flags

ROOT = Path(__file__).resolve().parents[1]

from pyvision_jax import wiring  # noqa: E402
from pyvision_jax.data import synthetic  # noqa: E402
from pyvision_jax.eval.bootstrap import (  # noqa: E402
    accuracy_interval,
    paired_difference_interval,
    record_task_accuracies,
)
from pyvision_jax.eval.records import TRAJECTORIES_FILE  # noqa: E402
from pyvision_jax.wiring.config_values import str_tuple  # noqa: E402
from pyvision_jax.wiring.evaluation import evaluate_checkpoint  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "tiny_cpu.py"), "Base config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.1", "0.3", "0.6", "1.0"], "Sampling temperatures.")
_PER_KIND = flags.DEFINE_integer("per-kind", 8, "Tasks of each synthetic kind, on each seed.")
_K = flags.DEFINE_integer("k", 2, "Rollouts per task.")
_VALIDATION_SEED = flags.DEFINE_integer("validation-seed", 777, "Synthetic seed the temperature is chosen on.")


def task_file(workdir: Path, seed: int, per_kind: int, kinds: tuple[str, ...]) -> Path:
    path = workdir / f"tasks_{seed}" / synthetic.ALL_TASKS_FILE
    if not path.is_file():
        synthetic.write_synthetic_task_file(path.parent, per_kind, seed, kinds)
    return path


def evaluate(config: Any, workdir: Path, seed: int, temperature: float, tasks: Path, k: int) -> dict[str, Any]:
    """One evaluation at `temperature`: its headline figures and per-task accuracies."""
    run_config = copy.deepcopy(config)
    run_config.eval.temperature = temperature
    out_dir = workdir / f"seed_{seed}" / f"T_{temperature:g}"
    results = evaluate_checkpoint(run_config, None, tasks, out_dir, k=k, progress=False)
    with open(out_dir / TRAJECTORIES_FILE) as f:
        per_task = record_task_accuracies(json.loads(line) for line in f if line.strip())
    interval = accuracy_interval(list(per_task.values()))
    return {
        "seed": seed,
        "temperature": temperature,
        "accuracy": results["accuracy"],
        "accuracy_ci95": interval.as_list(),
        "pass_at_k": results["pass_at_k"],
        "tool_calls": results["tool_calls"]["mean"],
        "end_reasons": results["end_reasons"],
        "num_rollouts": results["num_rollouts"],
        "out_dir": str(out_dir),
        "per_task": per_task,
    }


def best_temperature(evaluations: list[dict[str, Any]]) -> float:
    """The most accurate temperature (the first listed among equals)."""
    return max(evaluations, key=lambda e: (e["accuracy"], -evaluations.index(e)))["temperature"]


def line(e: dict[str, Any]) -> str:
    low, high = e["accuracy_ci95"]
    return (
        f"seed {e['seed']} T {e['temperature']:g}: accuracy {e['accuracy']:.3f} [{low:.3f}, {high:.3f}], "
        f"tool calls {e['tool_calls']:.2f}, {e['num_rollouts']} rollouts, end reasons {e['end_reasons']}"
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    config, workdir = _CONFIG.value, Path(_WORKDIR.value).absolute()
    temperatures = [float(t) for t in _TEMPERATURES.value]
    heldout_seed, validation_seed = int(config.eval.heldout_seed), _VALIDATION_SEED.value
    training = {int(config.data.synthetic_seed), int(config.sft.synthetic_seed)}
    if validation_seed == heldout_seed or heldout_seed in training:
        raise app.UsageError(
            f"the validation seed {validation_seed} and the training seeds {sorted(training)} "
            f"must differ from the held-out seed {heldout_seed}"
        )
    if not temperatures or min(temperatures) <= 0 or _PER_KIND.value < 1 or _K.value < 1:
        raise app.UsageError("--temperatures must be > 0, --per-kind and --k >= 1")
    kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
    workdir.mkdir(parents=True, exist_ok=True)
    wiring.use_compilation_cache(workdir)  # every evaluation builds its engine anew: compile each shape once
    start = time.perf_counter()
    validation_tasks = task_file(workdir, validation_seed, _PER_KIND.value, kinds)
    validation = []
    for temperature in temperatures:
        validation.append(evaluate(config, workdir, validation_seed, temperature, validation_tasks, _K.value))
        print(line(validation[-1]), flush=True)
    best = best_temperature(validation)
    reference = float(config.rollout.temperature)
    heldout_tasks = task_file(workdir, heldout_seed, _PER_KIND.value, kinds)
    heldout = {
        t: evaluate(config, workdir, heldout_seed, t, heldout_tasks, _K.value) for t in dict.fromkeys([best, reference])
    }
    for e in heldout.values():
        print(line(e), flush=True)
    difference = paired_difference_interval(heldout[reference]["per_task"], heldout[best]["per_task"])
    results = {
        "command": " ".join(sys.argv),
        "per_kind": _PER_KIND.value,
        "k": _K.value,
        "validation_seed": validation_seed,
        "heldout_seed": heldout_seed,
        "best_temperature": best,
        "reference_temperature": reference,
        "validation": validation,
        "heldout": list(heldout.values()),
        "heldout_best_minus_reference": {"difference": difference.estimate, "ci95": difference.as_list()},
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"best on seed {validation_seed}: T {best:g}; held-out seed {heldout_seed}: "
        f"accuracy {heldout[best]['accuracy']:.3f} {heldout[best]['accuracy_ci95']}, T {reference:g} "
        f"{heldout[reference]['accuracy']:.3f}; paired difference {difference.summary()}; "
        f"results: {workdir / 'results.json'} ({results['wall_time_s']:.0f} s)"
    )


if __name__ == "__main__":
    app.run(main)
