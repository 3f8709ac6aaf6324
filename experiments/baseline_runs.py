"""The starting policy's evaluations from a config: the validation and held-out sets
(`experiments.baselines.EvalSet`), their synthetic task files, one evaluation summarised
(`evaluate_summary`), and the fixed-temperature baselines (`temperature_sweep`,
`temperature_baselines`).

The sets' tasks go to WORKDIR/<set>/tasks (WORKDIR/heldout/tasks is the file
`wiring.heldout` writes too); a sweep's evaluations to ROOT/seed_<S>/T_<T>. Each is an
ordinary `pyvision-eval` output and a rerun reuses what is already there.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Callable, Iterable

import ml_collections

from experiments.baselines import (
    BASELINES_DIR,
    HELDOUT,
    VALIDATION,
    EvalSet,
    TemperatureBaselines,
    check_validation_seed,
)
from experiments.eval_summary import EvalSummary
from pyvision_jax.data import synthetic
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.evaluation import evaluate_checkpoint
from pyvision_jax.wiring.settings import heldout_config


def training_seeds(config: ml_collections.ConfigDict) -> dict[str, int]:
    """The synthetic seeds training draws tasks from (config key -> seed)."""
    return {
        "data.synthetic_seed": int(config.data.synthetic_seed),
        "sft.synthetic_seed": int(config.sft.synthetic_seed),
    }


def heldout_set(config: ml_collections.ConfigDict) -> EvalSet:
    """The held-out set of `eval.heldout_*` (ValueError when `eval.heldout_per_kind` is 0)."""
    held = heldout_config(config)
    if not held.per_kind:
        raise ValueError("the config has no held-out set: set --config.eval.heldout_per_kind > 0")
    return EvalSet(HELDOUT, held.seed, held.per_kind, held.k)


def validation_set(config: ml_collections.ConfigDict, seed: int, per_kind: int = 0) -> EvalSet:
    """The validation set on synthetic seed `seed`, which must be neither the held-out seed nor a
    training seed: `per_kind` tasks per kind (0: the held-out set's), the held-out set's k."""
    held = heldout_set(config)
    check_validation_seed(seed, held.seed, training_seeds(config))
    return EvalSet(VALIDATION, seed, per_kind or held.per_kind, held.k)


def synthetic_tasks(out_dir: str | os.PathLike, seed: int, per_kind: int, kinds: tuple[str, ...]) -> Path:
    """OUT_DIR/tasks.jsonl of `per_kind` tasks of each kind of `seed`, written when absent."""
    path = Path(out_dir) / synthetic.ALL_TASKS_FILE
    if not path.is_file():
        synthetic.write_synthetic_task_file(path.parent, per_kind, seed, kinds)
    return path


def set_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike, eval_set: EvalSet) -> Path:
    """WORKDIR/<set>/tasks/tasks.jsonl of the config's synthetic kinds."""
    kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
    return synthetic_tasks(Path(workdir) / eval_set.name / "tasks", eval_set.seed, eval_set.per_kind, kinds)


def evaluate_summary(
    config: ml_collections.ConfigDict,
    checkpoint: str | None,
    tasks: Path,
    out_dir: Path,
    k: int,
    temperature: float | None = None,
) -> EvalSummary:
    """Evaluates `checkpoint` (None: the config's own model) on `tasks` into `out_dir` at
    `temperature` (None: eval.temperature)."""
    run_config = copy.deepcopy(config)
    if temperature is not None:
        run_config.eval.temperature = temperature
    evaluate_checkpoint(run_config, checkpoint, tasks, out_dir, k=k, progress=False)
    return EvalSummary.from_dir(out_dir)


def temperature_dir(root: str | os.PathLike, seed: int, temperature: float) -> Path:
    return Path(root) / f"seed_{seed}" / f"T_{temperature:g}"


def temperature_sweep(
    config: ml_collections.ConfigDict,
    tasks: Path,
    root: str | os.PathLike,
    seed: int,
    temperatures: Iterable[float],
    k: int,
    log: Callable[[str], None] = print,
) -> dict[float, EvalSummary]:
    """The config's own model on `tasks` (of synthetic seed `seed`) at each temperature, into
    ROOT/seed_<seed>/T_<T>."""
    out = {}
    for temperature in dict.fromkeys(temperatures):
        out[temperature] = evaluate_summary(
            config, None, tasks, temperature_dir(root, seed, temperature), k, temperature
        )
        log(f"seed {seed} T {temperature:g}: {out[temperature].summary()}")
    return out


def temperature_baselines(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    temperatures: Iterable[float],
    validation: EvalSet,
    heldout: EvalSet,
    log: Callable[[str], None] = print,
) -> TemperatureBaselines:
    """The config's own model at each temperature on both sets (tasks in WORKDIR/<set>/tasks,
    evaluations in WORKDIR/baselines/seed_<S>/T_<T>); the best is chosen on validation."""
    temperatures = list(dict.fromkeys(temperatures))
    if not temperatures or min(temperatures) <= 0:
        raise ValueError(f"temperatures must be a non-empty list of values > 0, got {temperatures}")
    root = Path(workdir) / BASELINES_DIR
    sweeps = [
        temperature_sweep(config, set_tasks(config, workdir, s), root, s.seed, temperatures, s.k, log)
        for s in (validation, heldout)
    ]
    return TemperatureBaselines(validation, heldout, *sweeps)


def start_evaluations(
    config: ml_collections.ConfigDict, workdir: str | os.PathLike, sets: Iterable[EvalSet]
) -> dict[str, EvalSummary]:
    """The config's own model at eval.temperature on each set ({set name: summary}): step 0
    of every training run, in WORKDIR/baselines/seed_<S>/T_<T> (a baseline's evaluation when
    eval.temperature is one of the swept temperatures)."""
    root = Path(workdir) / BASELINES_DIR
    temperature = float(config.eval.temperature)
    return {
        s.name: evaluate_summary(
            config, None, set_tasks(config, workdir, s), temperature_dir(root, s.seed, temperature), s.k, temperature
        )
        for s in sets
    }
