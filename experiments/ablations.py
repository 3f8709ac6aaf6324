"""The paper's training-dynamics ablations at toy scale: the full recipe, one-switch ablations
and controls (`VARIANTS`), the curves their figures show, the steps at which the validation and
held-out sets are evaluated, and reading a run's TensorBoard curves back.
`experiments.dynamics_runs` trains and evaluates them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from experiments.baselines import HELDOUT, VALIDATION
from experiments.eval_summary import EvalSummary
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.run_logs.metrics import MetricsWriter

HELDOUT_ACCURACY = f"{HELDOUT}/accuracy"
HELDOUT_TOOL_CALLS = f"{HELDOUT}/tool_calls"
VALIDATION_ACCURACY = f"{VALIDATION}/accuracy"
VALIDATION_TOOL_CALLS = f"{VALIDATION}/tool_calls"
CAREFUL_SHARE = tags.tool_call_share_tag(2)
"""On the shapes toy the share of rollouts with two tool calls is the careful plan's."""
RECIPE = "recipe"
ABLATION = "ablation"
CONTROL = "control"
KINDS = (RECIPE, ABLATION, CONTROL)
"""What a variant is: the recipe itself, an ablation (one switch of it) or a control."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named set of config overrides ("section.field" -> value), its `kind` (KINDS) and what
    the paper saw (the recipe, an ablation) or what a control should show (a run whose
    rewards carry no task information)."""

    name: str
    overrides: dict[str, Any]
    paper: str
    kind: str = ABLATION

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"variant {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("full", {}, "accuracy, response length and tool calls rise together (Fig. 3)", RECIPE),
        Variant(
            "no_tool_reward",
            {"rl.tool_reward_coef": 0.0},
            "tool calls fall quickly and stay low: interaction collapse (Fig. 7)",
        ),
        Variant("std_norm", {"rl.normalize_std": True}, "removing the std normalisation helps (Fig. 5)"),
        Variant("arrival_order", {"rl.rank_by": "arrival"}, "ranking by std helps (Fig. 5)"),
        Variant("turns_2", {"episode.max_tool_calls": 2}, "a budget of 4 turns beats 2 later in training (Fig. 5)"),
        Variant(
            "random_reward",
            {"rl.reward_control": "random"},
            "no information in the rewards: held-out accuracy stays within noise of the start",
            CONTROL,
        ),
        Variant(
            "entropy_min",
            # a gradient norm of the recipe's order (0.3 on the shapes toy, where the recipe's runs 0.05-0.4)
            {"rl.reward_control": "entropy_min", "rl.entropy_coef": -2.0},
            "no rewards, only sharpening: held-out accuracy stays near the best fixed-temperature "
            "baseline (a recipe gain above it is not sharpening)",
            CONTROL,
        ),
    )
}

CURVES: tuple[str, ...] = (
    tags.REWARD_ACCURACY,
    HELDOUT_ACCURACY,
    VALIDATION_ACCURACY,
    tags.TOOLS_CALLS_PER_TRAJ,
    *(tags.tool_call_share_tag(n) for n in tags.TOOL_CALL_SHARE_BUCKETS),
    tags.RESPONSE_LENGTH,
    tags.ACTOR_ENTROPY,
    tags.ACTOR_GRAD_NORM,
    tags.ACTOR_REF_KL,
)
"""The curves a run's record keeps (besides any `params/` curve)."""


def eval_points(steps: int, every: int) -> list[int]:
    """The steps after which the validation and held-out sets are evaluated: every `every` and
    the last (step 0, the start, is evaluated besides)."""
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


def log_evaluations(tb_dir: Path, step: int, evaluations: Mapping[str, EvalSummary]) -> None:
    """Writes each evaluation's accuracy and tool calls as TensorBoard scalars of `step`, under
    its set's name ("heldout/accuracy", "validation/accuracy", ...). A scalar the directory
    already holds at `step` with the same value (a rerun reusing an evaluation) is not written
    again."""
    logged = read_curves(tb_dir) if Path(tb_dir).is_dir() else {}
    scalars = {}
    for name, result in evaluations.items():
        scalars[f"{name}/accuracy"] = result.accuracy
        scalars[f"{name}/tool_calls"] = result.tool_calls
    scalars = {
        tag: value
        for tag, value in scalars.items()
        if not math.isclose(dict(logged.get(tag, [])).get(step, math.nan), value, abs_tol=1e-6)
    }
    if not scalars:
        return
    writer = MetricsWriter(tb_dir)
    try:
        writer.write(step, scalars)
        writer.flush()
    finally:
        writer.close()
