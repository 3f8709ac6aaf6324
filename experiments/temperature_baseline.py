"""The untrained baseline every RL result must beat: the config's model sampled at fixed
temperatures, the best chosen on a validation seed and reported on the held-out seed.

    python -m experiments.temperature_baseline --workdir /tmp/temperature_baseline \
        [--temperatures 0.1,0.3,0.6,1.0] [--per-kind 8] [--k 2] [--validation-seed 777] [--config.x=y ...]

Evaluates the config's own model (configs/tiny_cpu.py: the packaged SFT checkpoint) with the
ordinary evaluation (`wiring.evaluation.evaluate_checkpoint`) at every temperature on
`--per-kind` synthetic tasks of each kind of the validation seed, picks the most accurate
(ties: the first listed), and evaluates it and the recipe's sampling temperature
(rollout.temperature) on the same number of tasks of the held-out seed (eval.heldout_seed).
Nothing is chosen by the held-out seed. Accuracies come with 95 % bootstrap intervals over
tasks, and the held-out comparison with the paired interval of the difference. Writes
WORKDIR/results.json; every evaluation lies under WORKDIR/seed_<S>/T_<T> and a rerun reuses it.
The seed checks, the choice and the evaluations are `experiments.baselines` and
`experiments.baseline_runs` (which `python -m experiments.reproduce_dynamics` runs too).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from experiments.baseline_runs import synthetic_tasks, temperature_sweep, training_seeds
from experiments.baselines import best_temperature, check_validation_seed, temperature_entry
from experiments.eval_summary import EvalSummary
from pyvision_jax import wiring
from pyvision_jax.cli.entry import run_command
from pyvision_jax.eval.bootstrap import paired_difference_interval
from pyvision_jax.wiring.config_values import str_tuple

ROOT = Path(__file__).resolve().parents[1]
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "tiny_cpu.py"), "Base config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.1", "0.3", "0.6", "1.0"], "Sampling temperatures.")
_PER_KIND = flags.DEFINE_integer("per-kind", 8, "Tasks of each synthetic kind, on each seed.")
_K = flags.DEFINE_integer("k", 2, "Rollouts per task.")
_VALIDATION_SEED = flags.DEFINE_integer("validation-seed", 777, "Synthetic seed the temperature is chosen on.")


def log(line: str) -> None:
    print(line, flush=True)


def sweep(
    config: Any, workdir: Path, seed: int, temperatures: list[float], kinds: tuple[str, ...]
) -> dict[float, EvalSummary]:
    """The config's model at each temperature on --per-kind tasks of `seed` (WORKDIR/tasks_<seed>)."""
    tasks = synthetic_tasks(workdir / f"tasks_{seed}", seed, _PER_KIND.value, kinds)
    return temperature_sweep(config, tasks, workdir, seed, temperatures, _K.value, log)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    config, workdir = _CONFIG.value, Path(_WORKDIR.value).absolute()
    temperatures = [float(t) for t in _TEMPERATURES.value]
    heldout_seed, validation_seed = int(config.eval.heldout_seed), _VALIDATION_SEED.value
    try:
        check_validation_seed(validation_seed, heldout_seed, training_seeds(config))
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    if not temperatures or min(temperatures) <= 0 or _PER_KIND.value < 1 or _K.value < 1:
        raise app.UsageError("--temperatures must be > 0, --per-kind and --k >= 1")
    kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
    workdir.mkdir(parents=True, exist_ok=True)
    wiring.use_compilation_cache(workdir)  # every evaluation builds its engine anew: compile each shape once
    start = time.perf_counter()
    validation = sweep(config, workdir, validation_seed, temperatures, kinds)
    best = best_temperature([(t, e.accuracy) for t, e in validation.items()])
    reference = float(config.rollout.temperature)
    heldout = sweep(config, workdir, heldout_seed, [best, reference], kinds)
    difference = paired_difference_interval(heldout[reference].per_task, heldout[best].per_task)
    results = {
        "command": " ".join(sys.argv),
        "per_kind": _PER_KIND.value,
        "k": _K.value,
        "validation_seed": validation_seed,
        "heldout_seed": heldout_seed,
        "best_temperature": best,
        "reference_temperature": reference,
        "validation": [temperature_entry(validation_seed, t, e) for t, e in validation.items()],
        "heldout": [temperature_entry(heldout_seed, t, e) for t, e in heldout.items()],
        "heldout_best_minus_reference": {"difference": difference.estimate, "ci95": difference.as_list()},
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"best on seed {validation_seed}: T {best:g}; held-out seed {heldout_seed}: "
        f"accuracy {heldout[best].interval().summary()}, T {reference:g} {heldout[reference].accuracy:.3f}; "
        f"paired difference {difference.summary()}; results: {workdir / 'results.json'} "
        f"({results['wall_time_s']:.0f} s)"
    )


if __name__ == "__main__":
    run_command(__name__, main)
