"""The training-dynamics ablations run: each variant of `experiments.ablations.VARIANTS` trained
from the same start with the same tasks, once per seed, evaluated on the validation and the
held-out set (`experiments.baseline_runs`) at the start and every few steps.

Each run trains in WORKDIR/<variant>/seed_<S> (an ordinary trainer workdir: TensorBoard
under tb/, the evaluations under validation/step_N and heldout/step_N, the segments' wall
times in wall_time.json), in segments: train to step n, evaluate both sets, resume to the
next n. The sets' tasks are shared (WORKDIR/<set>/tasks), and so is the start's evaluation.
A rerun resumes every run where it stopped.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import ml_collections

from experiments.ablations import CURVES, Variant, eval_points, log_evaluations, read_curves
from experiments.baseline_runs import evaluate_summary, set_tasks
from experiments.baselines import EvalSet
from experiments.dynamics_stats import VariantRun
from experiments.eval_summary import EvalSummary
from pyvision_jax.convert.run_layout import TB_DIR
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.wiring.training import train

WALL_TIME_FILE = "wall_time.json"


def variant_config(config: ml_collections.ConfigDict, variant: Variant) -> ml_collections.ConfigDict:
    """A copy of `config` with the variant's overrides (each must name an existing field)."""
    out = copy.deepcopy(config)
    for key, value in variant.overrides.items():
        section, _, field = key.partition(".")
        if section not in out or field not in out[section]:
            raise ValueError(f"variant {variant.name!r}: {key!r} is not a config field")
        out[section][field] = value
    return out


def check_seeds(config: ml_collections.ConfigDict, seeds: Sequence[int]) -> None:
    """Every seed's run must start from the model the baselines evaluate: a random init
    (model.hf_dir empty) draws its weights from `seed`, so it allows only config.seed."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list without repeats, got {list(seeds)}")
    if not config.model.hf_dir and list(seeds) != [int(config.seed)]:
        raise ValueError(
            f"a random-init start (model.hf_dir empty) depends on the seed: --seeds must be {int(config.seed)} "
            f"(config.seed), got {list(seeds)}"
        )


def run_dir(workdir: str | os.PathLike, variant: Variant, seed: int) -> Path:
    return Path(workdir) / variant.name / f"seed_{seed}"


def _wall_times(path: Path) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_variant(
    config: ml_collections.ConfigDict,
    variant: Variant,
    seed: int,
    workdir: str | os.PathLike,
    steps: int,
    eval_every: int,
    validation: EvalSet,
    heldout: EvalSet,
    start: Mapping[str, EvalSummary],
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> VariantRun:
    """Trains `variant` with `config.seed = seed` to `steps` in WORKDIR/<name>/seed_<seed>,
    evaluating both sets at `eval_points`; `start` ({set name: evaluation}) is the shared
    evaluation of the starting model (step 0). Each evaluation is logged to the run's
    TensorBoard as "<set>/accuracy" and "<set>/tool_calls"."""
    sets = (validation, heldout)
    if sorted(start) != sorted(s.name for s in sets):
        raise ValueError(f"start evaluations of {sorted(start)} for the sets {[s.name for s in sets]}")
    out_dir = run_dir(workdir, variant, seed)
    run_config = variant_config(config, variant)
    run_config.seed = seed
    tb_dir = out_dir / TB_DIR
    log_evaluations(tb_dir, 0, start)
    evaluations = {name: {0: result} for name, result in start.items()}
    wall_file = out_dir / WALL_TIME_FILE
    for stop in eval_points(steps, eval_every):
        begin = time.perf_counter()
        run_config.train.steps = stop
        summary = train(run_config, out_dir, progress=progress)
        if summary.last_step < stop:
            raise RuntimeError(f"{variant.name} seed {seed}: stopped at step {summary.last_step} before {stop}")
        now = {
            s.name: evaluate_summary(
                run_config, str(out_dir), set_tasks(config, workdir, s), out_dir / s.name / f"step_{stop}", s.k
            )
            for s in sets
        }
        log_evaluations(tb_dir, stop, now)
        for name, result in now.items():
            evaluations[name][stop] = result
        times = _wall_times(wall_file)
        if str(stop) not in times:  # the time a segment took when it ran, not a rerun's check
            times[str(stop)] = round(time.perf_counter() - begin, 1)
            wall_file.write_text(json.dumps(times, indent=1))
        log(f"{variant.name} seed {seed}: step {stop}: " + "; ".join(f"{n} {r.summary()}" for n, r in now.items()))
    curves = read_curves(tb_dir)
    return VariantRun(
        variant=variant,
        seed=seed,
        run_dir=str(out_dir),
        validation=evaluations[validation.name],
        heldout=evaluations[heldout.name],
        curves={
            **{tag: curves.get(tag, []) for tag in CURVES},
            **{tag: points for tag, points in curves.items() if tag.startswith(tags.PARAMS_PREFIX)},
        },
        wall_time_s=round(sum(_wall_times(wall_file).values()), 1),
    )
