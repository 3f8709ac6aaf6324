"""Figures of the ablation runs (eval/ablations.py): one panel per curve, the variants side
by side as in the paper's Fig. 3/5/7, and a markdown table of the held-out results."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pyvision_jax.eval.ablations import CURVES, HELDOUT_ACCURACY  # noqa: E402
from pyvision_jax.train import metric_names as tags  # noqa: E402

TITLES: dict[str, str] = {
    tags.REWARD_ACCURACY: "accuracy reward (training)",
    HELDOUT_ACCURACY: "held-out accuracy",
    tags.TOOLS_CALLS_PER_TRAJ: "tool calls per trajectory",
    tags.RESPONSE_LENGTH: "response length (tokens)",
    tags.ACTOR_ENTROPY: "entropy",
    tags.ACTOR_GRAD_NORM: "gradient norm",
}


def _title(tag: str) -> str:
    if tag.startswith(tags.PARAMS_PREFIX):
        return f"mean of {tag[len(tags.PARAMS_PREFIX) :].removesuffix('/mean')}"
    return TITLES[tag]


def plot_dynamics(runs: list[dict[str, Any]], out_png: str | os.PathLike, title: str = "") -> None:
    """One PNG: a grid of the CURVES (2 x 3), then any `params/` curve the runs logged (the
    parameters trained by `train.uniform_updates`), one line per run (`wiring.dynamics_runs.run_variant`
    output)."""
    params = sorted({tag for run in runs for tag in run["curves"] if tag.startswith(tags.PARAMS_PREFIX)})
    panels = [*CURVES, *params]
    columns = -(-len(panels) // 2)
    figure, axes = plt.subplots(2, columns, figsize=(5 * columns, 8))
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis, tag in zip(axes.flat, panels):
        for run in runs:
            points = run["curves"].get(tag, [])
            if points:
                steps, values = zip(*points)
                axis.plot(
                    steps, values, marker="o" if tag == HELDOUT_ACCURACY else None, markersize=3, label=run["name"]
                )
        axis.set_title(_title(tag))
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out_png, dpi=100)
    plt.close(figure)


def results_table(runs: list[dict[str, Any]]) -> str:
    """Markdown: per variant, held-out accuracy at the start and the end, the change, and
    mean tool calls per training trajectory over the first and last quarter of steps."""
    lines = [
        "| variant | held-out acc start | held-out acc end | change (points) | tool calls early | "
        "tool calls late | paper |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        held = sorted(run["heldout"].items(), key=lambda kv: int(kv[0]))
        start, end = held[0][1]["accuracy"], held[-1][1]["accuracy"]
        calls = [v for _, v in run["curves"].get(tags.TOOLS_CALLS_PER_TRAJ, [])]
        quarter = max(1, len(calls) // 4)
        early = sum(calls[:quarter]) / quarter if calls else float("nan")
        late = sum(calls[-quarter:]) / quarter if calls else float("nan")
        lines.append(
            f"| {run['name']} | {start:.3f} | {end:.3f} | {100 * (end - start):+.1f} | {early:.2f} | "
            f"{late:.2f} | {run['paper']} |"
        )
    return "\n".join(lines)
