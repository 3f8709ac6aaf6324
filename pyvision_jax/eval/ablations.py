"""The paper's training-dynamics ablations at toy scale: the full recipe and one-switch
variants, trained from the same start with the same seeds and tasks, each evaluated on
held-out tasks (eval/heldout.py) before training and every few steps.

Each variant trains in WORKDIR/<name> (an ordinary trainer workdir: TensorBoard under tb/,
held-out evaluations under heldout/), in segments: train to step n, evaluate, resume to the
next n. A rerun resumes every variant where it stopped.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from pyvision_jax.eval.heldout import HeldoutConfig, HeldoutResult, evaluate_heldout
from pyvision_jax.train import metric_names as tags
from pyvision_jax.train.metrics import MetricsWriter
from pyvision_jax.train.trainer import TB_DIR, train

HELDOUT_ACCURACY = "heldout/accuracy"
HELDOUT_TOOL_CALLS = "heldout/tool_calls"


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named set of config overrides ("section.field" -> value) and what the paper saw."""

    name: str
    overrides: dict[str, Any]
    paper: str


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("full", {}, "accuracy, response length and tool calls rise together (Fig. 3)"),
    Variant("no_tool_reward", {"rl.tool_reward_coef": 0.0},
            "tool calls fall quickly and stay low: interaction collapse (Fig. 7)"),
    Variant("std_norm", {"rl.normalize_std": True}, "removing the std normalisation helps (Fig. 5)"),
    Variant("arrival_order", {"rl.rank_by": "arrival"}, "ranking by std helps (Fig. 5)"),
    Variant("turns_2", {"episode.max_tool_calls": 2}, "a budget of 4 turns beats 2 later in training (Fig. 5)"),
)}

CURVES: tuple[str, ...] = (tags.REWARD_ACCURACY, HELDOUT_ACCURACY, tags.TOOLS_CALLS_PER_TRAJ, tags.RESPONSE_LENGTH,
                           tags.ACTOR_ENTROPY, tags.ACTOR_GRAD_NORM)
"""The curves the figures show, in panel order."""


def variant_config(config: ml_collections.ConfigDict, variant: Variant) -> ml_collections.ConfigDict:
    """A copy of `config` with the variant's overrides (each must name an existing field)."""
    out = copy.deepcopy(config)
    for key, value in variant.overrides.items():
        section, _, field = key.partition(".")
        if section not in out or field not in out[section]:
            raise ValueError(f"variant {variant.name!r}: {key!r} is not a config field")
        out[section][field] = value
    return out


def eval_points(steps: int, every: int) -> list[int]:
    """The steps after which the held-out set is evaluated: every `every` and the last."""
    if steps < 1 or every < 1:
        raise ValueError(f"steps and eval_every must be >= 1, got {steps} and {every}")
    return sorted({*range(every, steps + 1, every), steps})


def read_curves(tb_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard directory: {tag: [(step, value), ...]} sorted by step,
    the last value of a step kept (a resumed run may rewrite one)."""
    accumulator = event_accumulator.EventAccumulator(str(tb_dir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    curves = {}
    for tag in accumulator.Tags()["tensors"]:
        by_step = {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                   for event in accumulator.Tensors(tag)}
        curves[tag] = sorted(by_step.items())
    return curves


def _log_heldout(workdir: Path, step: int, result: HeldoutResult) -> None:
    writer = MetricsWriter(workdir / TB_DIR)
    try:
        writer.write(step, {HELDOUT_ACCURACY: result.accuracy, HELDOUT_TOOL_CALLS: result.tool_calls})
        writer.flush()
    finally:
        writer.close()


def run_variant(config: ml_collections.ConfigDict, variant: Variant, workdir: str | os.PathLike, steps: int,
                eval_every: int, before: HeldoutResult, log: Callable[[str], None] = print,
                progress: bool = False) -> dict[str, Any]:
    """Trains `variant` to `steps` in WORKDIR/<name>, evaluating the held-out set at
    `eval_points`; returns its curves and held-out results. `before` is the shared
    evaluation of the starting model (logged as step 0)."""
    HeldoutConfig.from_config(config)
    run_dir = Path(workdir) / variant.name
    run_config = variant_config(config, variant)
    _log_heldout(run_dir, 0, before)
    heldout = {0: before}
    for stop in eval_points(steps, eval_every):
        run_config.train.steps = stop
        summary = train(run_config, run_dir, progress=progress)
        if summary.last_step < stop:
            raise RuntimeError(f"variant {variant.name!r} stopped at step {summary.last_step} before {stop}")
        heldout[stop] = evaluate_heldout(run_config, run_dir, str(run_dir), f"step_{stop}")
        _log_heldout(run_dir, stop, heldout[stop])
        log(f"{variant.name}: step {stop}: held-out {heldout[stop].summary()}")
    curves = read_curves(run_dir / TB_DIR)
    return {"name": variant.name, "overrides": variant.overrides, "paper": variant.paper,
            "heldout": {str(step): {"accuracy": r.accuracy, "tool_calls": r.tool_calls}
                        for step, r in sorted(heldout.items())},
            "curves": {**{tag: curves.get(tag, []) for tag in CURVES},
                       **{tag: points for tag, points in curves.items() if tag.startswith(tags.PARAMS_PREFIX)}}}
