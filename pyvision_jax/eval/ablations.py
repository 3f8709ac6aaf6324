"""The paper's training-dynamics ablations at toy scale: the full recipe and one-switch
variants (`VARIANTS`), the curves their figures show, the steps at which the held-out set is
evaluated, and reading a run's TensorBoard curves back. `pyvision_jax.wiring.dynamics_runs`
trains and evaluates them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from pyvision_jax.eval.heldout import HeldoutResult
from pyvision_jax.train import metric_names as tags
from pyvision_jax.train.metrics import MetricsWriter

HELDOUT_ACCURACY = "heldout/accuracy"
HELDOUT_TOOL_CALLS = "heldout/tool_calls"


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named set of config overrides ("section.field" -> value) and what the paper saw."""

    name: str
    overrides: dict[str, Any]
    paper: str


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("full", {}, "accuracy, response length and tool calls rise together (Fig. 3)"),
        Variant(
            "no_tool_reward",
            {"rl.tool_reward_coef": 0.0},
            "tool calls fall quickly and stay low: interaction collapse (Fig. 7)",
        ),
        Variant("std_norm", {"rl.normalize_std": True}, "removing the std normalisation helps (Fig. 5)"),
        Variant("arrival_order", {"rl.rank_by": "arrival"}, "ranking by std helps (Fig. 5)"),
        Variant("turns_2", {"episode.max_tool_calls": 2}, "a budget of 4 turns beats 2 later in training (Fig. 5)"),
    )
}

CURVES: tuple[str, ...] = (
    tags.REWARD_ACCURACY,
    HELDOUT_ACCURACY,
    tags.TOOLS_CALLS_PER_TRAJ,
    tags.RESPONSE_LENGTH,
    tags.ACTOR_ENTROPY,
    tags.ACTOR_GRAD_NORM,
)
"""The curves the figures show, in panel order."""


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
        by_step = {
            event.step: float(tensor_util.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)
        }
        curves[tag] = sorted(by_step.items())
    return curves


def log_heldout(tb_dir: Path, step: int, result: HeldoutResult) -> None:
    """Writes a held-out evaluation's accuracy and tool calls as TensorBoard scalars of `step`."""
    writer = MetricsWriter(tb_dir)
    try:
        writer.write(step, {HELDOUT_ACCURACY: result.accuracy, HELDOUT_TOOL_CALLS: result.tool_calls})
        writer.flush()
    finally:
        writer.close()
