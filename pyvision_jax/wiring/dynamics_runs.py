"""The training-dynamics ablations run: each variant of `eval.ablations.VARIANTS` trained
from the same start with the same seeds and tasks, evaluated on held-out tasks before
training and every few steps.

Each variant trains in WORKDIR/<name> (an ordinary trainer workdir: TensorBoard under tb/,
held-out evaluations under heldout/), in segments: train to step n, evaluate, resume to the
next n. A rerun resumes every variant where it stopped.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections

from pyvision_jax.eval.ablations import CURVES, Variant, eval_points, log_heldout, read_curves
from pyvision_jax.eval.heldout import HeldoutResult
from pyvision_jax.train import metric_names as tags
from pyvision_jax.train.run_harness import TB_DIR
from pyvision_jax.wiring.heldout import evaluate_heldout
from pyvision_jax.wiring.settings import heldout_config
from pyvision_jax.wiring.training import train


def variant_config(config: ml_collections.ConfigDict, variant: Variant) -> ml_collections.ConfigDict:
    """A copy of `config` with the variant's overrides (each must name an existing field)."""
    out = copy.deepcopy(config)
    for key, value in variant.overrides.items():
        section, _, field = key.partition(".")
        if section not in out or field not in out[section]:
            raise ValueError(f"variant {variant.name!r}: {key!r} is not a config field")
        out[section][field] = value
    return out


def run_variant(
    config: ml_collections.ConfigDict,
    variant: Variant,
    workdir: str | os.PathLike,
    steps: int,
    eval_every: int,
    before: HeldoutResult,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> dict[str, Any]:
    """Trains `variant` to `steps` in WORKDIR/<name>, evaluating the held-out set at
    `eval_points`; returns its curves and held-out results. `before` is the shared
    evaluation of the starting model (logged as step 0)."""
    heldout_config(config)
    run_dir = Path(workdir) / variant.name
    run_config = variant_config(config, variant)
    log_heldout(run_dir / TB_DIR, 0, before)
    heldout = {0: before}
    for stop in eval_points(steps, eval_every):
        run_config.train.steps = stop
        summary = train(run_config, run_dir, progress=progress)
        if summary.last_step < stop:
            raise RuntimeError(f"variant {variant.name!r} stopped at step {summary.last_step} before {stop}")
        heldout[stop] = evaluate_heldout(run_config, run_dir, str(run_dir), f"step_{stop}")
        log_heldout(run_dir / TB_DIR, stop, heldout[stop])
        log(f"{variant.name}: step {stop}: held-out {heldout[stop].summary()}")
    curves = read_curves(run_dir / TB_DIR)
    return {
        "name": variant.name,
        "overrides": variant.overrides,
        "paper": variant.paper,
        "heldout": {
            str(step): {"accuracy": r.accuracy, "tool_calls": r.tool_calls} for step, r in sorted(heldout.items())
        },
        "curves": {
            **{tag: curves.get(tag, []) for tag in CURVES},
            **{tag: points for tag, points in curves.items() if tag.startswith(tags.PARAMS_PREFIX)},
        },
    }
