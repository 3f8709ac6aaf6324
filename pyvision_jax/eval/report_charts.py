"""Inline SVG bar charts of the evaluation report, drawn from results.json alone.

Each chart is one ``<svg>`` element placed in the page as is: no script, no external
reference, so it renders under the report's Content-Security-Policy and in any browser.
Geometry is in whole pixels. Every bar is a ``<rect class="bar">`` carrying its category in
``data-label`` and its value in ``data-value`` (with a ``<title>`` tooltip), and every axis
tick a ``<line class="tick">`` with its value in ``data-value``, so a test can read the chart
back and check that bar lengths match the axis.

The results hold no confidence interval of the per-source accuracy, so its bars are labelled
with the counts behind them (tasks and rollouts) instead.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

ACCURACY_COLOUR = "#4c72b0"
TOOL_CALLS_COLOUR = "#dd8452"
DONE_COLOUR = "#55a868"
OTHER_END_COLOUR = "#c44e52"
_AXIS_COLOUR = "#555555"
_GRID_COLOUR = "#dddddd"
_TEXT_COLOUR = "#222222"
_SVG_STYLE = "font-family:system-ui,sans-serif;font-size:12px;background:#ffffff"

_CHAR_WIDTH = 8  # the advance of a wide 12 px character (capitals): sizes the room for text
_PLOT_WIDTH = 300
_ROW_HEIGHT = 24
_BAR_HEIGHT = 16
_TOP = 40  # title and tick labels
_BOTTOM = 8
_MAX_LABEL_CHARS = 22
_MIN_COLUMNS_WIDTH = 240  # room for the title of a chart with few columns


@dataclass(frozen=True)
class Bar:
    """One bar: its category, its value (in axis units), the text written next to it and its
    fill colour."""

    label: str
    value: float
    note: str
    colour: str


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL_CHARS else label[: _MAX_LABEL_CHARS - 1] + "\u2026"


def count_ticks(maximum: int, most: int = 5) -> list[int]:
    """Ticks of a count axis: 0 to a round number >= ``maximum`` in whole steps of 1, 2 or
    5 x 10^n, at most ``most`` + 1 of them ([0, 1] when ``maximum`` is 0)."""
    if maximum <= 0:
        return [0, 1]
    raw = maximum / most
    magnitude = 10 ** max(0, math.floor(math.log10(raw)))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    count = math.ceil(maximum / step - 1e-9)
    return [i * step for i in range(count + 1)]


def _number(value: float) -> str:
    return f"{value:g}"


def _svg(chart_id: str, title: str, width: int, height: int, body: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{_e(chart_id)}" class="chart" '
        f'role="img" aria-label="{_e(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{_SVG_STYLE}">'
        f"<title>{_e(title)}</title>"
        f'<text x="4" y="14" font-weight="600" fill="{_TEXT_COLOUR}">{_e(title)}</text>' + "".join(body) + "</svg>"
    )


def _rect(x: int, y: int, width: int, height: int, bar: Bar) -> str:
    return (
        f'<rect class="bar" x="{x}" y="{y}" width="{width}" height="{height}" '
        f'fill="{bar.colour}" data-label="{_e(bar.label)}" data-value="{_number(bar.value)}">'
        f"<title>{_e(bar.label)}: {_e(bar.note)}</title></rect>"
    )


def horizontal_bars(chart_id: str, title: str, bars: Sequence[Bar], ticks: Sequence[float]) -> str:
    """One row per bar, lengths on a shared axis from 0 to ``ticks[-1]``."""
    scale = _PLOT_WIDTH / ticks[-1]
    left = 14 + _CHAR_WIDTH * max(len(_short(bar.label)) for bar in bars)  # the category names
    bottom = _TOP + len(bars) * _ROW_HEIGHT
    body = []
    for tick in ticks:
        x = left + round(tick * scale)
        body.append(
            f'<line class="tick" data-value="{_number(tick)}" x1="{x}" y1="{_TOP - 4}" '
            f'x2="{x}" y2="{bottom}" stroke="{_GRID_COLOUR}"/>'
            f'<text x="{x}" y="{_TOP - 8}" text-anchor="middle" fill="{_AXIS_COLOUR}">'
            f"{_number(tick)}</text>"
        )
    for row, bar in enumerate(bars):
        top = _TOP + row * _ROW_HEIGHT + (_ROW_HEIGHT - _BAR_HEIGHT) // 2
        width = round(max(0.0, bar.value) * scale)
        middle = top + _BAR_HEIGHT // 2 + 4
        body.append(
            f'<text x="{left - 6}" y="{middle}" text-anchor="end" fill="{_TEXT_COLOUR}">{_e(_short(bar.label))}</text>'
        )
        body.append(_rect(left, top, width, _BAR_HEIGHT, bar))
        body.append(f'<text x="{left + width + 6}" y="{middle}" fill="{_TEXT_COLOUR}">{_e(bar.note)}</text>')
    body.append(f'<line x1="{left}" y1="{_TOP - 4}" x2="{left}" y2="{bottom}" stroke="{_AXIS_COLOUR}"/>')
    notes = 12 + _CHAR_WIDTH * max(len(bar.note) for bar in bars)  # written right of the bars
    return _svg(chart_id, title, left + _PLOT_WIDTH + notes, bottom + _BOTTOM, body)


def vertical_bars(
    chart_id: str, title: str, bars: Sequence[Bar], ticks: Sequence[float], x_title: str, y_title: str
) -> str:
    """One column per bar (a histogram over ordered bins), heights on an axis from 0 to
    ``ticks[-1]``. A column's note is written above it where it fits (else it is in the
    tooltip only), and the bin labels are thinned out to keep them apart."""
    plot_height, left, top = 160, 56, _TOP + 8
    column = max(6, min(48, 900 // max(1, len(bars))))
    label_every = math.ceil(max(_CHAR_WIDTH * len(bar.label) + 8 for bar in bars) / column)
    gap = max(1, column // 5)
    scale = plot_height / ticks[-1]
    bottom = top + plot_height
    width = max(_MIN_COLUMNS_WIDTH, left + len(bars) * column + 16)
    first = left + (width - 16 - left - len(bars) * column) // 2  # the columns centred on the axis
    body = [
        f'<text x="14" y="{top + plot_height // 2}" fill="{_AXIS_COLOUR}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_height // 2})">{_e(y_title)}</text>'
    ]
    for tick in ticks:
        y = bottom - round(tick * scale)
        body.append(
            f'<line class="tick" data-value="{_number(tick)}" x1="{left - 4}" y1="{y}" '
            f'x2="{width - 8}" y2="{y}" stroke="{_GRID_COLOUR}"/>'
            f'<text x="{left - 8}" y="{y + 4}" text-anchor="end" fill="{_AXIS_COLOUR}">'
            f"{_number(tick)}</text>"
        )
    body.append(f'<line x1="{left}" y1="{bottom}" x2="{width - 8}" y2="{bottom}" stroke="{_AXIS_COLOUR}"/>')
    for index, bar in enumerate(bars):
        x = first + index * column + gap
        height = round(max(0.0, bar.value) * scale)
        centre = x + (column - 2 * gap) // 2
        body.append(_rect(x, bottom - height, column - 2 * gap, height, bar))
        if bar.note and _CHAR_WIDTH * len(bar.note) <= column:
            body.append(
                f'<text x="{centre}" y="{bottom - height - 4}" text-anchor="middle" '
                f'fill="{_TEXT_COLOUR}">{_e(bar.note)}</text>'
            )
        if index % label_every == 0:
            body.append(
                f'<text x="{centre}" y="{bottom + 14}" text-anchor="middle" '
                f'fill="{_AXIS_COLOUR}">{_e(bar.label)}</text>'
            )
    body.append(
        f'<text x="{left + (width - left) // 2}" y="{bottom + 30}" text-anchor="middle" '
        f'fill="{_AXIS_COLOUR}">{_e(x_title)}</text>'
    )
    return _svg(chart_id, title, width, bottom + 38, body)


def accuracy_chart(per_source: Mapping[str, Mapping[str, Any]]) -> str:
    """Accuracy per data source on a 0..1 axis, each bar labelled with its value and the
    tasks and rollouts it averages; empty without sources."""
    if not per_source:
        return ""
    bars = []
    for name, source in per_source.items():
        accuracy = float(source.get("accuracy") or 0.0)
        counts = [
            f"{source[key]} {word}{'' if source[key] == 1 else 's'}"
            for key, word in (("num_tasks", "task"), ("num_rollouts", "rollout"))
            if source.get(key) is not None
        ]
        note = f"{accuracy:.3f}" + (f" ({', '.join(counts)})" if counts else "")
        bars.append(Bar(str(name), accuracy, note, ACCURACY_COLOUR))
    return horizontal_bars("chart-accuracy", "Accuracy per data source", bars, [0, 0.25, 0.5, 0.75, 1])


def tool_calls_chart(distribution: Mapping[str, int]) -> str:
    """Histogram of tool calls per trajectory; integer bins missing from the distribution are
    drawn as empty columns. Empty without trajectories."""
    if not distribution:
        return ""
    counts = {str(key): int(value) for key, value in distribution.items()}
    if all(key.isdigit() for key in counts):
        bins = [str(n) for n in range(max(int(key) for key in counts) + 1)]
    else:
        bins = list(counts)
    bars = [
        Bar(name, counts.get(name, 0), str(counts[name]) if counts.get(name) else "", TOOL_CALLS_COLOUR)
        for name in bins
    ]
    return vertical_bars(
        "chart-tool-calls",
        "Tool calls per trajectory",
        bars,
        count_ticks(max(counts.values())),
        "tool calls",
        "trajectories",
    )


def _share(count: int, total: int) -> str:
    percent = 100 * count / total
    return "<1%" if 0 < percent < 0.5 else f"{percent:.0f}%"


def end_reasons_chart(end_reasons: Mapping[str, int]) -> str:
    """Trajectories per end reason, with their share; DONE in green, every other reason (a
    limit or a failure) in red. Empty without trajectories."""
    total = sum(int(count) for count in end_reasons.values())
    if not total:
        return ""
    bars = [
        Bar(
            str(reason),
            int(count),
            f"{int(count)} ({_share(int(count), total)})",
            DONE_COLOUR if reason == "DONE" else OTHER_END_COLOUR,
        )
        for reason, count in end_reasons.items()
    ]
    return horizontal_bars(
        "chart-end-reasons", "End reasons", bars, count_ticks(max(int(count) for count in end_reasons.values()))
    )
