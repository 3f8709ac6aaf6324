"""The evaluation report: one HTML file (inline CSS and JS) built from results.json and
trajectories.jsonl, its images the files of ``media/`` beside it (records of older
evaluations embed theirs, shown as data: URIs). It is written trajectory by trajectory as the
records are read, so neither the page nor the records are ever whole in memory; at most
``max_rollouts_per_task`` rollouts of each task are shown (a correct and a wrong one among
them when the task has both), every one when it is None.

Summary tables first (scores, per data source, tool calls, end reasons, video token
efficiency), the first three with an inline SVG bar chart beside them (``report_charts``),
then one view per trajectory: the question, each turn's reasoning and code, the
interpreter's text, the images the code produced, the answer, its score and the end reason.
Filters by correctness and by data source are plain JS over ``data-*`` attributes; a URL
fragment like ``#correct=1&source=vstar`` presets them (shareable links).

Model-written text is hostile: every piece of it is HTML-escaped and placed in element
content or quoted attributes only; the script never reads or evaluates it. The script
records its own errors (``window.onerror``) in ``#js-errors``, writes the number of
trajectories it indexed in ``#js-status`` and, once the page has loaded, the number of images
and of those that failed to load in ``#js-images``, so a headless browser can check the page.
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TextIO

from pyvision_jax.eval.records import (
    MEDIA_DIR,
    REPORT_FILE,
    RESULTS_FILE,
    TRAJECTORIES_FILE,
    atomic_text_file,
    iter_finished,
)
from pyvision_jax.eval.report_charts import accuracy_chart, end_reasons_chart, tool_calls_chart

_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_MEDIA_FILE = re.compile(rf"^{MEDIA_DIR}/[0-9a-f]{{32}}\.(png|jpg)$")
_CODE_BLOCK = re.compile(r"<code>.*?</code>", re.DOTALL)

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}
th{background:#eee}
pre{white-space:pre-wrap;word-break:break-word;background:#f3f3f3;padding:.5em;margin:.3em 0;
font-size:.85em;max-height:30em;overflow:auto}
pre.code{background:#1e1e2e;color:#e0e0e0}
.trajectory{border:1px solid #bbb;border-left:6px solid #999;background:#fff;margin:1em 0;
padding:.6em 1em}
.trajectory.correct{border-left-color:#2a9d3a}.trajectory.wrong{border-left-color:#c0392b}
.turn{border-top:1px dashed #ccc;margin-top:.5em;padding-top:.3em}
.label{font-weight:600;font-size:.85em;color:#555}
.meta span{margin-right:1.2em}
img{max-width:360px;max-height:360px;border:1px solid #ccc;margin:.2em}
#filters{position:sticky;top:0;background:#fafafa;padding:.5em 0;border-bottom:1px solid #ccc}
.hidden{display:none}
.error{color:#c0392b}
.chart-row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
svg.chart{border:1px solid #ddd;margin:.5em 0}
"""

_JS = """
(function () {
  var errors = document.getElementById('js-errors');
  function record(message) {
    var item = document.createElement('div');
    item.textContent = String(message);
    errors.appendChild(item);
  }
  window.addEventListener('error', function (event) { record(event.message); });
  window.addEventListener('unhandledrejection', function (event) { record(event.reason); });
  function apply() {
    var correctness = document.getElementById('filter-correct').value;
    var source = document.getElementById('filter-source').value;
    var shown = 0;
    var items = document.querySelectorAll('.trajectory');
    for (var i = 0; i < items.length; i++) {
      var item = items[i];
      var ok = (correctness === 'all' || item.getAttribute('data-correct') === correctness) &&
               (source === '' || item.getAttribute('data-source') === source);
      item.classList.toggle('hidden', !ok);
      if (ok) { shown += 1; }
    }
    document.getElementById('shown-count').textContent = String(shown);
    document.getElementById('total-count').textContent = String(items.length);
    return items.length;
  }
  function fromHash() {
    var pairs = window.location.hash.replace(/^#/, '').split('&');
    for (var i = 0; i < pairs.length; i++) {
      var eq = pairs[i].indexOf('=');
      if (eq < 0) { continue; }
      var key = decodeURIComponent(pairs[i].slice(0, eq));
      var value = decodeURIComponent(pairs[i].slice(eq + 1));
      var select = document.getElementById(key === 'correct' ? 'filter-correct' :
                                           key === 'source' ? 'filter-source' : '');
      if (select) { select.value = value; }
    }
  }
  window.addEventListener('load', function () {
    var broken = 0;
    for (var i = 0; i < document.images.length; i++) {
      if (!document.images[i].complete || document.images[i].naturalWidth === 0) { broken += 1; }
    }
    document.getElementById('js-images').textContent =
      'images ' + document.images.length + ' broken ' + broken;
  });
  document.getElementById('filter-correct').addEventListener('change', apply);
  document.getElementById('filter-source').addEventListener('change', apply);
  window.addEventListener('hashchange', function () { fromHash(); apply(); });
  fromHash();
  var total = apply();
  document.getElementById('js-status').textContent = 'ready ' + total;
})();
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return _e(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_number(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(image: Mapping[str, Any]) -> str:
    title = f"image_clue_{image.get('label')} ({image.get('num_tokens')} tokens)"
    if "file" in image:
        source = str(image["file"])
        if not _MEDIA_FILE.match(source):
            return '<span class="error">[image file not in media/]</span>'
    else:
        data = str(image.get("png_base64", ""))
        if not _BASE64.match(data):
            return '<span class="error">[image data not valid base64]</span>'
        source = f"data:image/png;base64,{data}"
    return f'<img alt="{_e(title)}" title="{_e(title)}" src="{source}">'


def _with_chart(table: str, chart: str) -> str:
    """A summary table with its chart beside it (below it on a narrow window)."""
    return f'<div class="chart-row">{table}{chart}</div>'


def _summary(results: Mapping[str, Any]) -> str:
    parts = [
        "<h2>Summary</h2>",
        _table(
            [
                "tasks done / total",
                "rollouts",
                "accuracy",
                "avg@k",
                "pass@k",
                "k",
                "mean tool calls",
                "mean visual tokens per task",
                "mean response tokens",
                "wall time (s, all runs)",
            ],
            [
                [
                    f"{results.get('num_tasks_done')} / {results.get('num_tasks_total')}",
                    results.get("num_rollouts"),
                    results.get("accuracy"),
                    results.get("avg_at_k"),
                    results.get("pass_at_k"),
                    results.get("settings", {}).get("k"),
                    results.get("tool_calls", {}).get("mean"),
                    results.get("mean_visual_tokens_per_task"),
                    results.get("mean_response_tokens"),
                    results.get("wall_time_s_all_runs"),
                ]
            ],
        ),
    ]
    sources = results.get("per_data_source", {})
    parts += [
        "<h2>Per data source</h2>",
        _with_chart(
            _table(
                ["data source", "tasks", "accuracy", "avg@k", "pass@k"],
                [
                    [name, s.get("num_tasks"), s.get("accuracy"), s.get("avg_at_k"), s.get("pass_at_k")]
                    for name, s in sources.items()
                ],
            ),
            accuracy_chart(sources),
        ),
    ]
    distribution = results.get("tool_calls", {}).get("distribution", {})
    end_reasons = results.get("end_reasons", {})
    parts += [
        "<h2>Tool calls per trajectory</h2>",
        _with_chart(_table(["tool calls", "trajectories"], distribution.items()), tool_calls_chart(distribution)),
        "<h2>End reasons</h2>",
        _with_chart(_table(["end reason", "trajectories"], end_reasons.items()), end_reasons_chart(end_reasons)),
    ]
    video = results.get("video_token_efficiency", {})
    if video.get("num_video_tasks"):
        parts += [
            "<h2>Video token efficiency (agent context vs uniform 1-fps sampling)</h2>",
            _table(
                ["video tasks", "mean agent visual tokens", "mean 1-fps tokens", "ratio of means"],
                [
                    [
                        video["num_video_tasks"],
                        video["mean_agent_visual_tokens"],
                        video["mean_uniform_1fps_tokens"],
                        video["ratio_of_means"],
                    ]
                ],
            ),
            _table(
                ["task", "agent visual tokens (mean over k)", "1-fps tokens", "ratio"],
                [
                    [task_id, v["agent_visual_tokens"], v["uniform_1fps_tokens"], v["ratio"]]
                    for task_id, v in video.get("per_task", {}).items()
                ],
            ),
        ]
    settings = results.get("settings", {})
    parts += ["<h2>Settings</h2>", _table(["setting", "value"], settings.items())]
    run = results.get("run", {})
    if run:
        parts.append(_table(["run", "value"], run.items()))
    return "\n".join(parts)


def _turn(turn: Mapping[str, Any], images: Mapping[Any, Mapping[str, Any]], index: int) -> str:
    text = str(turn.get("text", ""))
    code = turn.get("code")
    reasoning = _CODE_BLOCK.sub("", text).strip() if code else text
    parts = [
        f'<div class="turn"><div class="label">turn {index + 1} '
        f"({_e(turn.get('action'))}, finish: {_e(turn.get('finish_reason'))})</div>",
        f'<div class="label">reasoning</div><pre class="reasoning">{_e(reasoning)}</pre>',
    ]
    if code:
        parts.append(f'<div class="label">code</div><pre class="code">{_e(code)}</pre>')
    if turn.get("interpreter_text") is not None:
        parts.append(
            f'<div class="label">interpreter</div><pre class="interpreter">{_e(turn["interpreter_text"])}</pre>'
        )
    elif turn.get("observation"):
        parts.append(f'<div class="label">observation</div><pre class="interpreter">{_e(turn["observation"])}</pre>')
    if turn.get("tool_error"):
        parts.append(f'<div class="label error">tool error</div><pre class="error">{_e(turn["tool_error"])}</pre>')
    labels = turn.get("image_labels") or []
    if labels:
        parts.append(
            '<div class="label">images produced</div><div>'
            + "".join(_image(images[label]) for label in labels if label in images)
            + "</div>"
        )
    parts.append("</div>")
    return "".join(parts)


def _trajectory(record: Mapping[str, Any], number: int) -> str:
    task = record.get("task", {})
    images = {im.get("label"): im for im in record.get("images", [])}
    correct = bool(record.get("correct"))
    options = task.get("options") or []
    task_images = "".join(_image(im) for im in record.get("images", []) if im.get("source") == "task")
    media = _e(task.get("video_path") or task.get("image_path"))
    parts = [
        f'<section class="trajectory {"correct" if correct else "wrong"}" '
        f'id="trajectory-{number}" data-correct="{int(correct)}" '
        f'data-source="{_e(record.get("data_source"))}">',
        f'<div class="meta"><span><b>{_e(record.get("task_id"))}</b> '
        f"rollout {_e(record.get('rollout_index'))}</span>"
        f"<span>source: {_e(record.get('data_source'))}</span>"
        f"<span>{'correct' if correct else 'wrong'}</span>"
        f"<span>score: {_number(record.get('score'))}</span>"
        f"<span>end: {_e(record.get('end_reason'))}</span>"
        f"<span>tool calls: {_e(record.get('num_tool_calls'))}</span>"
        f"<span>visual tokens: {_e(record.get('visual_tokens'))}</span></div>",
        f'<div class="label">question</div><pre class="question">{_e(task.get("question"))}'
        + ("\n" + "\n".join(f"({chr(65 + i)}) {_e(o)}" for i, o in enumerate(options)) if options else "")
        + "</pre>",
        f'<div class="label">media: {media}</div><div>{task_images}</div>',
        f"<details><summary>full prompt</summary><pre>{_e(record.get('prompt'))}</pre></details>",
    ]
    parts += [_turn(turn, images, i) for i, turn in enumerate(record.get("turns", []))]
    parts.append(
        f'<div class="turn"><span class="label">answer:</span> '
        f'<code class="answer">{_e(record.get("extracted") or record.get("final_answer"))}</code>'
        f' &nbsp; <span class="label">ground truth:</span> <code>{_e(task.get("answer"))}</code>'
        f' &nbsp; <span class="label">score:</span> {_number(record.get("score"))}'
        f' &nbsp; <span class="label">end reason:</span> {_e(record.get("end_reason"))}</div>'
    )
    parts.append("</section>")
    return "\n".join(parts)


def shown_rollouts(records: Sequence[Mapping[str, Any]], cap: int | None) -> list[Mapping[str, Any]]:
    """The first ``cap`` records of a task (all when None); when two or more are shown, all
    correct or all wrong, and the task has both, the last is swapped for the first of the other."""
    shown = list(records[:cap])
    if len(records) > len(shown) >= 2:
        kinds = {bool(r.get("correct")) for r in shown}
        other = next((r for r in records[len(shown) :] if bool(r.get("correct")) not in kinds), None)
        if len(kinds) == 1 and other is not None:
            shown[-1] = other
    return shown


def _head(results: Mapping[str, Any], sources: Iterable[str], cap: int | None, title: str) -> str:
    source_options = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in sorted(sources))
    k = results.get("settings", {}).get("k")
    capped = (
        f"<p>Showing up to {_e(cap)} of the {_e(k)} rollouts of each task, a correct and a wrong one among "
        f"them where the task has both (<code>pyvision-eval --report-all</code> shows every one).</p>"
        if cap is not None and isinstance(k, int) and k > cap
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{_e(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{_e(title)}</h1>
<div id="js-errors" class="error"></div>
{_summary(results)}
<h2>Trajectories</h2>
{capped}
<div id="filters">
 <label>correctness <select id="filter-correct"><option value="all">all</option>
 <option value="1">correct</option><option value="0">wrong</option></select></label>
 <label>data source <select id="filter-source"><option value="">all</option>{source_options}</select></label>
 <span>shown: <span id="shown-count"></span> / <span id="total-count"></span></span>
 <span id="js-status"></span> <span id="js-images"></span>
</div>
"""


def write_page(
    stream: TextIO,
    results: Mapping[str, Any],
    tasks: Iterable[Sequence[Mapping[str, Any]]],
    sources: Iterable[str],
    max_rollouts_per_task: int | None = None,
    title: str = "pyvision_jax evaluation",
) -> int:
    """Writes the report page to ``stream``: the summary of ``results``, then the shown
    rollouts of each task's records as they come, offering ``sources`` in the source filter;
    returns the number of trajectories written."""
    stream.write(_head(results, sources, max_rollouts_per_task, title))
    number = 0
    for records in tasks:
        for record in shown_rollouts(records, max_rollouts_per_task):
            stream.write(_trajectory(record, number) + "\n")
            number += 1
    stream.write(f"<script>{_JS}</script>\n</body></html>\n")
    return number


def render_report(
    results: Mapping[str, Any], records: Sequence[Mapping[str, Any]], title: str = "pyvision_jax evaluation"
) -> str:
    """The report page for ``results`` (results.json) and every one of the trajectory ``records``."""
    page = io.StringIO()
    write_page(page, results, [[r] for r in records], {str(r.get("data_source")) for r in records}, title=title)
    return page.getvalue()


def write_report(out_dir: str | Path, max_rollouts_per_task: int | None = None) -> Path:
    """Writes ``out_dir/report.html`` from the results and trajectories there (atomically,
    streaming the records); ``max_rollouts_per_task`` keeps the page small for large k."""
    out_dir = Path(out_dir)
    results = json.loads((out_dir / RESULTS_FILE).read_text())
    k = int(results.get("settings", {}).get("k", 1))
    jsonl = out_dir / TRAJECTORIES_FILE
    tasks = iter_finished(jsonl, k) if jsonl.is_file() else iter(())
    path = out_dir / REPORT_FILE
    with atomic_text_file(path) as stream:
        write_page(stream, results, tasks, results.get("per_data_source", {}), max_rollouts_per_task)
    return path
