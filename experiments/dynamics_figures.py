"""Figures of the ablation runs (records of `experiments.dynamics_stats.run_records`): the curves
side by side as in the paper's Fig. 3/5/7, one line per variant (the mean over its seeds,
each seed a thin line), and the held-out plan shares at the start and the end."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure

from experiments.ablations import CAREFUL_SHARE, HELDOUT_ACCURACY
from pyvision_jax.data.shape_plans import PLANS
from pyvision_jax.eval.plan_shares import mean_shares
from pyvision_jax.run_logs import metric_names as tags

PANELS: tuple[str, ...] = (
    HELDOUT_ACCURACY,
    tags.REWARD_ACCURACY,
    tags.TOOLS_CALLS_PER_TRAJ,
    CAREFUL_SHARE,
    tags.ACTOR_ENTROPY,
    tags.RESPONSE_LENGTH,
)
"""The panels of the dynamics figure, in order (then any `params/` curve)."""

TITLES: dict[str, str] = {
    HELDOUT_ACCURACY: "held-out accuracy",
    tags.REWARD_ACCURACY: "accuracy reward (training)",
    tags.TOOLS_CALLS_PER_TRAJ: "tool calls per trajectory",
    CAREFUL_SHARE: "careful-plan share (2 tool calls, training)",
    tags.ACTOR_ENTROPY: "entropy",
    tags.RESPONSE_LENGTH: "response length (tokens)",
}
PLAN_COLOURS = {"quick": "tab:blue", "careful": "tab:green", "guess": "tab:orange", "other": "tab:gray"}


def _title(tag: str) -> str:
    if tag.startswith(tags.PARAMS_PREFIX):
        return f"mean of {tag[len(tags.PARAMS_PREFIX) :].removesuffix('/mean')}"
    return TITLES[tag]


def by_variant(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The runs grouped by variant name, in the order the variants first appear."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        out.setdefault(run["name"], []).append(run)
    return out


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> list[tuple[int, float]]:
    """The mean of several runs' curves at the steps every one of them has."""
    values = [{int(step): float(value) for step, value in points} for points in curves]
    common = sorted(set.intersection(*(set(v) for v in values))) if values else []
    return [(step, sum(v[step] for v in values) / len(values)) for step in common]


def plot_dynamics(
    runs: Sequence[Mapping[str, Any]],
    out_png: str | os.PathLike,
    title: str = "",
    baseline: float | None = None,
    start: float | None = None,
    baseline_label: str = "best fixed temperature",
) -> None:
    """One PNG: a 2 x 3 grid of the PANELS, then any `params/` curve the runs logged (the
    parameters trained by `train.uniform_updates`); one line per variant. The held-out panel
    shows `baseline` (the best fixed-temperature baseline) dashed and `start` (the starting
    model) dotted."""
    params = sorted({tag for run in runs for tag in run["curves"] if tag.startswith(tags.PARAMS_PREFIX)})
    panels = [*PANELS, *params]
    columns = -(-len(panels) // 2)
    figure = Figure(figsize=(5 * columns, 8))  # no pyplot: no global backend, nothing to close
    axes = figure.subplots(2, columns, squeeze=False)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = by_variant(runs)
    for axis, tag in zip(axes.flat, panels):
        for n, (name, group) in enumerate(groups.items()):
            colour = colours[n % len(colours)]
            curves = [run["curves"].get(tag, []) for run in group]
            if len(group) > 1:
                for points in curves:
                    if points:
                        axis.plot(*zip(*points), color=colour, linewidth=0.6, alpha=0.35)
            mean = mean_curve([points for points in curves if points])
            if mean:  # evaluations, and curves of a point or two, as markers
                marker = "o" if tag == HELDOUT_ACCURACY or len(mean) <= 2 else None
                axis.plot(*zip(*mean), color=colour, marker=marker, markersize=3, label=name)
        if tag == HELDOUT_ACCURACY:
            if baseline is not None:
                axis.axhline(baseline, color="black", linestyle="--", linewidth=1, label=baseline_label)
            if start is not None:
                axis.axhline(start, color="gray", linestyle=":", linewidth=1, label="start (SFT)")
        axis.set_title(_title(tag))
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out_png, dpi=100)


def stacked_plan_bar(axis: Any, x: float, shares: Mapping[str, float], legend: bool) -> None:
    """One bar at `x` of the plan shares stacked in PLANS order (an absent plan: 0), each plan
    labelled for the legend when `legend`."""
    bottom = 0.0
    for plan in PLANS:
        share = shares.get(plan, 0.0)
        axis.bar(x, share, width=0.36, bottom=bottom, color=PLAN_COLOURS[plan], label=plan if legend else None)
        bottom += share


def plot_plans(runs: Sequence[Mapping[str, Any]], out_png: str | os.PathLike, title: str = "") -> None:
    """One PNG: per variant two stacked bars, the held-out plan shares (PLANS) at the start and
    at the last step (means over seeds), from each record's statistics."""
    groups = by_variant(runs)
    figure = Figure(figsize=(max(4.0, 1.6 * len(groups) + 1.5) + 1.2, 4))
    axis = figure.subplots()
    positions, labels = [], []
    for n, group in enumerate(groups.values()):
        for offset, when in ((-0.2, "start"), (0.2, "last")):
            shares = mean_shares([run["statistics"]["plans"][when] for run in group])
            stacked_plan_bar(axis, n + offset, shares, legend=n == 0 and when == "start")
            positions.append(n + offset)
            labels.append("start" if when == "start" else "end")
    axis.set_xticks(positions, labels, fontsize=7)
    for n, name in enumerate(groups):
        axis.text(n, 1.03, name, ha="center", fontsize=8, transform=axis.get_xaxis_transform())
    axis.set_ylim(0, 1)
    axis.set_ylabel("share of held-out rollouts")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        axis.set_title(title, pad=18, fontsize=9)
    figure.tight_layout()
    figure.savefig(out_png, dpi=100)


def plot_plans_by_family(runs: Sequence[Mapping[str, Any]], out_png: str | os.PathLike, title: str = "") -> bool:
    """One PNG with a panel per task family: for every run (variant and seed) two stacked bars,
    the held-out plan shares at the start and at the early-stopped step
    (`statistics.plans_by_family`). Returns False, writing nothing, when the runs' tasks hold
    fewer than two families."""
    families = sorted({f for run in runs for f in run["statistics"].get("plans_by_family", {}).get("start", {})})
    if len(families) < 2:
        return False
    figure = Figure(figsize=(max(4.0, 1.1 * len(runs) + 1.5) * len(families) / 1.4 + 1.2, 4))
    axes = figure.subplots(1, len(families), sharey=True, squeeze=False)[0]
    for axis, family in zip(axes, families):
        positions, labels = [], []
        for n, run in enumerate(runs):
            plans = run["statistics"]["plans_by_family"]
            for offset, when in ((-0.2, "start"), (0.2, "early_stopped")):
                first = axis is axes[0] and n == 0 and when == "start"
                stacked_plan_bar(axis, n + offset, plans[when].get(family, {}), legend=first)
                positions.append(n + offset)
                labels.append("start" if when == "start" else "RL")
            axis.text(
                n,
                1.02,
                f"{run['name']}, seed {run['seed']}",
                ha="center",
                fontsize=7,
                transform=axis.get_xaxis_transform(),
            )
        axis.set_xticks(positions, labels, fontsize=7)
        axis.set_ylim(0, 1)
        axis.set_title(family, pad=16, fontsize=9)
    axes[0].set_ylabel("share of held-out rollouts")
    axes[-1].legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(out_png, dpi=100)
    return True
