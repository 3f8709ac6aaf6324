"""The statistics of the training-dynamics runs (`experiments.ablations`): early stopping on the
validation set, per-run held-out figures with bootstrap intervals over tasks, tool-call
ratios to the full recipe, and the checks of the learning claims (`claim_checks`).

A run is evaluated on the validation and the held-out set at step 0 (the start) and at every
eval point. Its reported result is the held-out evaluation at the step of best validation
accuracy (`early_stop_step`); the last step's is kept beside it. Nothing is chosen by the
held-out set.
"""

from __future__ import annotations

import dataclasses
from statistics import fmean
from typing import Any, Mapping, Sequence

from experiments.ablations import Variant
from experiments.eval_summary import EvalSummary
from experiments.fixed_policies import FixedPolicy
from pyvision_jax.eval.bootstrap import paired_difference_interval
from pyvision_jax.run_logs import metric_names as tags

FULL = "full"
RANDOM_REWARD = "random_reward"
NO_TOOL_REWARD = "no_tool_reward"
MIN_GAIN = 0.10
"""The full recipe's early-stopped held-out gain over the best fixed-temperature baseline must reach this."""
RANDOM_MAX_CHANGE = 0.03
"""The random-reward control's |last - start| held-out accuracy must stay within this."""
COLLAPSE_RATIO = 0.7
"""Without the tool reward, the end tool calls must fall to at most this share of the full recipe's."""
MIN_INPUT_INDEPENDENT_GAIN = 0.05
"""The full recipe's early-stopped held-out gain over the best input-independent policy must reach this."""
FAMILY_PLANS = {"shapes_easy": "guess", "shapes_hard": "careful"}
"""The plan right most often on each shapes family (`experiments.plan_accuracy`): the untooled
guess on the easy one, the careful plan on the hard one."""
MIN_FAMILY_SHARE = 0.6
"""The full recipe's early-stopped held-out share of each family's best plan must reach this."""
OVER_SEEDS = "over_seeds"
"""The key of `claim_checks` holding the claims checked on the means over seeds."""


def early_stop_step(validation_accuracy: Mapping[int, float]) -> int:
    """The step of the best validation accuracy (the earliest among equals)."""
    if not validation_accuracy:
        raise ValueError("early stopping needs at least one validation evaluation")
    return min(validation_accuracy, key=lambda step: (-validation_accuracy[step], step))


def _last_value(points: Sequence[Sequence[float]]) -> float | None:
    return float(points[-1][1]) if points else None


def _first_value(points: Sequence[Sequence[float]]) -> float | None:
    return float(points[0][1]) if points else None


def _accuracy(summary: EvalSummary, step: int) -> dict[str, Any]:
    return {"step": step, "accuracy": summary.accuracy, "ci95": summary.interval().as_list()}


def _difference(baseline: EvalSummary, candidate: EvalSummary) -> dict[str, Any]:
    interval = paired_difference_interval(baseline.per_task, candidate.per_task)
    return {"estimate": interval.estimate, "ci95": interval.as_list()}


def run_statistics(
    validation: Mapping[int, EvalSummary],
    heldout: Mapping[int, EvalSummary],
    baseline: EvalSummary,
    curves: Mapping[str, Sequence[Sequence[float]]],
) -> dict[str, Any]:
    """One run's statistics from its evaluations by step (both sets at the same steps, 0 the
    start), the best fixed-temperature baseline's held-out evaluation and its training curves."""
    if sorted(validation) != sorted(heldout) or 0 not in heldout:
        raise ValueError(
            f"validation steps {sorted(validation)} and held-out steps {sorted(heldout)} must match and include 0"
        )
    chosen = early_stop_step({step: e.accuracy for step, e in validation.items()})
    last = max(heldout)
    start, stopped, end = heldout[0], heldout[chosen], heldout[last]
    calls = curves.get(tags.TOOLS_CALLS_PER_TRAJ, [])
    return {
        "early_stop_step": chosen,
        "validation_at_early_stop": validation[chosen].accuracy,
        "heldout_start": _accuracy(start, 0),
        "heldout_early_stopped": _accuracy(stopped, chosen),
        "heldout_last": _accuracy(end, last),
        "early_stopped_minus_baseline": _difference(baseline, stopped),
        "last_minus_start": _difference(start, end),
        "tool_calls": {
            "heldout_start": start.tool_calls,
            "heldout_early_stopped": stopped.tool_calls,
            "heldout_last": end.tool_calls,
            "train_first": _first_value(calls),
            "train_last": _last_value(calls),
        },
        "plans": {"start": dict(start.plans), "early_stopped": dict(stopped.plans), "last": dict(end.plans)},
        "plans_by_ability": {"start": _by_ability(start), "last": _by_ability(end)},
        "plans_by_family": {
            "start": _by_family(start),
            "early_stopped": _by_family(stopped),
            "last": _by_family(end),
        },
        "accuracy_by_family": {
            "start": dict(start.accuracy_by_family),
            "early_stopped": dict(stopped.accuracy_by_family),
            "last": dict(end.accuracy_by_family),
        },
        "accuracy_by_ability": {
            "start": dict(start.accuracy_by_ability),
            "early_stopped": dict(stopped.accuracy_by_ability),
            "last": dict(end.accuracy_by_ability),
        },
    }


def _by_ability(summary: EvalSummary) -> dict[str, dict[str, float]]:
    return {ability: dict(shares) for ability, shares in summary.plans_by_ability.items()}


def _by_family(summary: EvalSummary) -> dict[str, dict[str, float]]:
    return {family: dict(shares) for family, shares in summary.plans_by_family.items()}


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def tool_call_ratios(
    statistics: Mapping[tuple[str, int], Mapping[str, Any]],
) -> dict[tuple[str, int], dict[str, float | None]]:
    """Per (variant, seed): its end tool calls over the full recipe's of the same seed, on the
    held-out set and on the training curve (None without a full run or when full's are 0)."""
    out = {}
    for (name, seed), stats in statistics.items():
        full = statistics.get((FULL, seed))
        calls, reference = stats["tool_calls"], full["tool_calls"] if full else {}
        out[name, seed] = {
            "heldout_last": _ratio(calls["heldout_last"], reference.get("heldout_last")),
            "train_last": _ratio(calls["train_last"], reference.get("train_last")),
        }
    return out


def claim_checks(statistics: Mapping[tuple[str, int], Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per seed ("seed_<s>"), the checks of the learning claims whose variants ran:

    - full_gain: the full recipe's early-stopped held-out gain over the best baseline has a
      95 % interval above 0 and an estimate >= MIN_GAIN;
    - random_reward: its held-out |last - start| <= RANDOM_MAX_CHANGE;
    - no_tool_reward: its held-out end tool calls <= COLLAPSE_RATIO x the full recipe's;
    - full_tool_calls: the full recipe's held-out end tool calls >= its start's;
    - input_independent_gain: the full recipe's early-stopped held-out gain over the best
      input-independent policy has a 95 % interval above 0 and an estimate >=
      MIN_INPUT_INDEPENDENT_GAIN (where that policy was given);
    - plans_by_family: on each shapes family of FAMILY_PLANS, the full recipe's early-stopped
      held-out share of the family's best plan >= MIN_FAMILY_SHARE;

    and, under OVER_SEEDS when the recipe ran with two seeds or more, the two tool-call claims
    on the means over the seeds (the paper's figures are one run each; a toy's seeds vary).
    """
    out: dict[str, dict[str, Any]] = {}
    for seed in sorted({seed for _, seed in statistics}):
        checks: dict[str, Any] = {}
        full = statistics.get((FULL, seed))
        if full:
            gain = full["early_stopped_minus_baseline"]
            low = gain["ci95"][0]
            checks["full_gain"] = {
                "estimate": gain["estimate"],
                "ci95": gain["ci95"],
                "ci_low_above_0": low > 0,
                "estimate_at_least": MIN_GAIN,
                "passed": low > 0 and gain["estimate"] >= MIN_GAIN,
            }
            calls = full["tool_calls"]
            checks["full_tool_calls"] = {
                "start": calls["heldout_start"],
                "end": calls["heldout_last"],
                "passed": calls["heldout_last"] >= calls["heldout_start"],
            }
            checks.update(adaptivity_checks(full))
        control = statistics.get((RANDOM_REWARD, seed))
        if control:
            change = control["last_minus_start"]["estimate"]
            checks["random_reward"] = {
                "last_minus_start": change,
                "max_change": RANDOM_MAX_CHANGE,
                "passed": abs(change) <= RANDOM_MAX_CHANGE,
            }
        ablation = statistics.get((NO_TOOL_REWARD, seed))
        if ablation and full:
            end, reference = ablation["tool_calls"]["heldout_last"], full["tool_calls"]["heldout_last"]
            checks["no_tool_reward"] = {
                "end_tool_calls": end,
                "full_end_tool_calls": reference,
                "max_ratio": COLLAPSE_RATIO,
                "passed": end <= COLLAPSE_RATIO * reference,
            }
        checks["passed"] = all(check["passed"] for check in checks.values()) if checks else None
        out[f"seed_{seed}"] = checks
    over_seeds = _tool_claims_over_seeds(statistics, out)
    if over_seeds:
        out[OVER_SEEDS] = over_seeds
    return out


def adaptivity_checks(full: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`claim_checks`' input_independent_gain and plans_by_family of one full-recipe run's
    statistics, those whose figures it has."""
    checks: dict[str, dict[str, Any]] = {}
    gain = full.get("early_stopped_minus_input_independent")
    if gain:
        low = gain["ci95"][0]
        checks["input_independent_gain"] = {
            "baseline": gain["baseline"],
            "estimate": gain["estimate"],
            "ci95": gain["ci95"],
            "estimate_at_least": MIN_INPUT_INDEPENDENT_GAIN,
            "passed": low > 0 and gain["estimate"] >= MIN_INPUT_INDEPENDENT_GAIN,
        }
    shares = full.get("plans_by_family", {}).get("early_stopped", {})
    families = [family for family in FAMILY_PLANS if family in shares]
    if families:
        chosen = {family: shares[family][FAMILY_PLANS[family]] for family in families}
        checks["plans_by_family"] = {
            "best_plan_share": {f"{family} {FAMILY_PLANS[family]}": share for family, share in chosen.items()},
            "min_share": MIN_FAMILY_SHARE,
            "passed": all(share >= MIN_FAMILY_SHARE for share in chosen.values()),
        }
    return checks


def _tool_claims_over_seeds(
    statistics: Mapping[tuple[str, int], Mapping[str, Any]], per_seed: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The two tool-call claims on the means over the seeds where their runs ran (when there
    are at least two), with how many seeds pass them one by one."""
    checks: dict[str, Any] = {}
    seeds = sorted(seed for name, seed in statistics if name == FULL)
    if len(seeds) >= 2:
        start = fmean([statistics[FULL, s]["tool_calls"]["heldout_start"] for s in seeds])
        end = fmean([statistics[FULL, s]["tool_calls"]["heldout_last"] for s in seeds])
        checks["full_tool_calls"] = {
            "seeds": seeds,
            "start": start,
            "end": end,
            "seeds_passed": sum(per_seed[f"seed_{s}"]["full_tool_calls"]["passed"] for s in seeds),
            "passed": end >= start,
        }
    paired = [s for s in seeds if (NO_TOOL_REWARD, s) in statistics]
    if len(paired) >= 2:
        end = fmean([statistics[NO_TOOL_REWARD, s]["tool_calls"]["heldout_last"] for s in paired])
        reference = fmean([statistics[FULL, s]["tool_calls"]["heldout_last"] for s in paired])
        checks["no_tool_reward"] = {
            "seeds": paired,
            "end_tool_calls": end,
            "full_end_tool_calls": reference,
            "ratio": end / reference if reference else None,
            "max_ratio": COLLAPSE_RATIO,
            "seeds_passed": sum(per_seed[f"seed_{s}"]["no_tool_reward"]["passed"] for s in paired),
            "passed": end <= COLLAPSE_RATIO * reference,
        }
    if checks:
        checks["passed"] = all(check["passed"] for check in checks.values())
    return checks


@dataclasses.dataclass(frozen=True)
class VariantRun:
    """One variant trained with one seed: its evaluations by step on each set (0: the start),
    its TensorBoard curves and the wall time its segments took."""

    variant: Variant
    seed: int
    run_dir: str
    validation: Mapping[int, EvalSummary]
    heldout: Mapping[int, EvalSummary]
    curves: Mapping[str, Sequence[Sequence[float]]]
    wall_time_s: float


def _by_step(evaluations: Mapping[int, EvalSummary]) -> dict[str, dict[str, Any]]:
    return {str(step): e.as_dict() for step, e in sorted(evaluations.items())}


def input_independent_gains(run: VariantRun, reference: FixedPolicy, early_stop: int) -> dict[str, Any]:
    """The run's held-out accuracy early-stopped and last minus the best input-independent
    policy's on the same tasks, each with its paired 95 % bootstrap interval."""
    return {
        "early_stopped_minus_input_independent": reference.gain_of(run.heldout[early_stop]),
        "last_minus_input_independent": reference.gain_of(run.heldout[max(run.heldout)]),
    }


def run_records(
    runs: Sequence[VariantRun], baseline: EvalSummary, reference: FixedPolicy | None = None
) -> list[dict[str, Any]]:
    """results.json's record of each run: what it is, its evaluations, curves and statistics
    (`run_statistics` plus the tool-call ratios to the full recipe of the same seed, and given
    `reference`, the best input-independent policy, the gains over it)."""
    statistics = {}
    for run in runs:
        stats = run_statistics(run.validation, run.heldout, baseline, run.curves)
        if reference is not None:
            stats.update(input_independent_gains(run, reference, stats["early_stop_step"]))
        statistics[run.variant.name, run.seed] = stats
    ratios = tool_call_ratios(statistics)
    return [
        {
            "name": run.variant.name,
            "kind": run.variant.kind,
            "seed": run.seed,
            "overrides": run.variant.overrides,
            "paper": run.variant.paper,
            "run_dir": run.run_dir,
            "wall_time_s": run.wall_time_s,
            "validation": _by_step(run.validation),
            "heldout": _by_step(run.heldout),
            "curves": {tag: [list(point) for point in points] for tag, points in run.curves.items()},
            "statistics": {
                **statistics[run.variant.name, run.seed],
                "tool_calls_ratio_to_full": ratios[run.variant.name, run.seed],
            },
        }
        for run in runs
    ]


def statistics_by_run(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], Mapping[str, Any]]:
    """{(variant, seed): statistics} of `run_records` output (the input of `claim_checks`)."""
    return {(record["name"], int(record["seed"])): record["statistics"] for record in records}
