"""The HTML report opened in headless Chromium: every trajectory shown, no script errors,
hostile model text inert, filters working, the summary charts drawn with the results' values."""

import html
import io
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.eval.records import MEDIA_DIR, REPORT_FILE, RESULTS_FILE, TRAJECTORIES_FILE
from pyvision_jax.eval.report import render_report, shown_rollouts, write_page, write_report
from pyvision_jax.eval.report_charts import ACCURACY_COLOUR, DONE_COLOUR, OTHER_END_COLOUR, TOOL_CALLS_COLOUR
from tests.eval.scripted_benchmark import HOSTILE, run_scripted_evaluation

CHROMIUM = "/usr/bin/chromium"
SVG = "{http://www.w3.org/2000/svg}"
SCREEN = (1280, 1400)


@pytest.fixture(scope="module")
def report(tokenizer, benchmark, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run_scripted_evaluation(tokenizer, benchmark, out, seed=0)
    return out / REPORT_FILE


def headless_chromium(profile, *arguments):
    """Runs headless Chromium (offline: file:// pages only) with a private profile."""
    assert shutil.which(CHROMIUM), "Debian's chromium is required (apt-get install chromium)"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *arguments,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dump_dom(path, profile, fragment=""):
    """The DOM after load, as headless Chromium serializes it."""
    return headless_chromium(profile, "--dump-dom", f"file://{path}{fragment}")


def charts(page):
    """The page's inline SVG charts by id, parsed as XML."""
    found = {
        match.group(1): ET.fromstring(match.group(0))
        for match in re.finditer(r'<svg [^>]*id="(chart-[\w-]+)".*?</svg>', page, re.DOTALL)
    }
    assert all(svg.tag == f"{SVG}svg" for svg in found.values())
    return found


def bars(svg):
    """(label, value, rect) of each bar, in drawing order."""
    return [
        (rect.get("data-label"), float(rect.get("data-value")), rect)
        for rect in svg.iter(f"{SVG}rect")
        if rect.get("class") == "bar"
    ]


def ticks(svg):
    """{tick value: the tick line}."""
    return {float(line.get("data-value")): line for line in svg.iter(f"{SVG}line") if line.get("class") == "tick"}


def geometry(rect):
    return tuple(int(rect.get(name)) for name in ("x", "y", "width", "height"))


def element_text(dom, element_id):
    match = re.search(rf'<(\w+)[^>]*id="{element_id}"[^>]*>(.*?)</\1>', dom, re.DOTALL)
    assert match, f"#{element_id} missing"
    return match.group(2)


@pytest.fixture(scope="module")
def dom(report, tmp_path_factory):
    return dump_dom(report, tmp_path_factory.mktemp("profile"))


def test_report_loads_in_chromium_and_shows_every_trajectory(dom):
    assert element_text(dom, "js-errors") == ""
    assert element_text(dom, "js-status") == "ready 8"
    assert element_text(dom, "shown-count") == "8"
    sections = re.findall(r'<section class="trajectory (correct|wrong)"', dom)
    assert sections.count("correct") == 4 and sections.count("wrong") == 4
    for task_id in ("mc-1", "num-1", "vid-1", "mc-2"):
        assert len(re.findall(rf"<b>{task_id}</b> rollout [01]<", dom)) == 2
    # task images (3 image tasks x 2) + code images (1 + 2), all files of media/ that load
    assert len(re.findall(r'src="media/[0-9a-f]{32}\.png"', dom)) == 6 + 3
    assert not re.search(r'(src|href)="(?!media/)', dom)
    assert element_text(dom, "js-images") == "images 9 broken 0"


def test_each_image_is_stored_once_beside_the_report(report):
    records = [json.loads(line) for line in (report.parent / TRAJECTORIES_FILE).read_text().splitlines()]
    task_files = {r["task_id"]: {im["file"] for im in r["images"] if im["source"] == "task"} for r in records}
    assert all("png_base64" not in im for r in records for im in r["images"])
    assert len(task_files) == 4 and sum(len(files) for files in task_files.values()) == 3  # one per image task
    referenced = {im["file"] for r in records for im in r["images"]}
    assert sorted(f"media/{p.name}" for p in (report.parent / MEDIA_DIR).iterdir()) == sorted(referenced)
    for file in referenced:
        assert Image.open(report.parent / file).format == "PNG"


def test_hostile_model_text_is_shown_but_never_runs(dom):
    body_tag = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body_tag
    assert html.escape(HOSTILE, quote=False) in dom
    assert "<script>document.body" not in dom


def test_fragment_filters_by_correctness_and_source(report, tmp_path):
    dom = dump_dom(report, tmp_path / "profile", "#correct=1&source=src_a")
    assert element_text(dom, "js-errors") == ""
    assert element_text(dom, "shown-count") == "1"
    visible = re.findall(
        r'<section class="trajectory correct" id="[^"]+" data-correct="1" '
        r'data-source="src_a">',
        dom,
    )
    assert len(visible) == 1
    assert len(re.findall(r'<section class="trajectory \w+ hidden"', dom)) == 7


def test_report_escapes_every_model_field():
    record = {
        "task_id": "<i>t</i>",
        "data_source": '"><script>x()</script>',
        "rollout_index": 0,
        "score": 1.0,
        "correct": True,
        "end_reason": "DONE",
        "task": {"question": "<b>q</b>", "answer": "<u>A</u>", "options": ["<s>o</s>"], "image_path": "<p>.png"},
        "prompt": "</pre><script>p()</script>",
        "extracted": "<em>A</em>",
        "turns": [
            {
                "text": "<h1>r</h1>",
                "code": "</pre><script>c()</script>",
                "action": "code",
                "finish_reason": "stop",
                "interpreter_text": "<script>i()</script>",
                "image_labels": [1],
                "tool_error": "<script>e()</script>",
            }
        ],
        "images": [{"label": 1, "source": "code", "num_tokens": 4, "png_base64": 'AAAA" onerror="x()'}],
    }
    page = render_report({"settings": {"k": 1, "note": "<script>s()</script>"}}, [record])
    assert page.count("<script>") == 1  # the report's own
    for tag in ("<i>", "<b>q", "<u>", "<s>", "<p>", "<h1>r", "<em>", '"><script'):
        assert tag not in page
    for text in (
        "&lt;i&gt;t&lt;/i&gt;",
        "&lt;h1&gt;r&lt;/h1&gt;",
        "&lt;script&gt;i()",
        "&lt;/pre&gt;&lt;script&gt;c()",
        "&quot;&gt;&lt;script&gt;x()",
    ):
        assert text in page
    assert "[image data not valid base64]" in page and "onerror" not in page


def test_script_errors_would_be_reported(report, tmp_path):
    """The error capture is live: a failing script after the report's own shows up."""
    broken = tmp_path / "broken.html"
    broken.write_text(report.read_text().replace("</body>", "<script>null.missing();</script></body>"))
    dom = dump_dom(broken, tmp_path / "profile")
    assert "null" in element_text(dom, "js-errors")


def test_report_can_show_fewer_rollouts_per_task(report, tmp_path):
    for name in (RESULTS_FILE, TRAJECTORIES_FILE):
        (tmp_path / name).write_bytes((report.parent / name).read_bytes())
    page = write_report(tmp_path, max_rollouts_per_task=1).read_text()
    assert re.findall(r"<b>([\w-]+)</b> rollout (\d)<", page) == [
        ("mc-1", "0"),
        ("num-1", "0"),
        ("vid-1", "0"),
        ("mc-2", "0"),
    ]


def test_a_capped_task_shows_a_correct_and_a_wrong_rollout_when_it_has_both():
    def task(*correct):
        return [{"rollout_index": i, "correct": c} for i, c in enumerate(correct)]

    def shown(records, cap):
        return [r["rollout_index"] for r in shown_rollouts(records, cap)]

    assert shown(task(True, True, True, False, True), 3) == [0, 1, 3]
    assert shown(task(False, False, True, True), 2) == [0, 2]
    assert shown(task(True, False, True, True), 2) == [0, 1]
    assert shown(task(True, True, True), 2) == [0, 1]
    assert shown(task(True, True, False), 1) == [0]
    assert shown(task(True, True, False), None) == [0, 1, 2]


def test_a_capped_page_says_so_and_an_old_record_with_embedded_images_still_shows(report, tmp_path):
    results = json.loads((report.parent / RESULTS_FILE).read_text())
    old = {"task_id": "t", "correct": True, "images": [{"label": 0, "source": "task", "png_base64": "iVBORw0KGgo="}]}
    page = io.StringIO()
    assert write_page(page, results, [[old, old, old]], ["src_a"], max_rollouts_per_task=1) == 1
    assert "Showing up to 1 of the 2 rollouts of each task" in page.getvalue()
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in page.getvalue()
    assert "Showing up to" not in render_report(results, [old])
    forged = {"images": [{"label": 0, "source": "task", "file": "../../etc/passwd"}]}
    assert "[image file not in media/]" in render_report(results, [forged])


def test_charts_draw_the_results_on_their_axes(report):
    page = report.read_text()
    results = json.loads((report.parent / RESULTS_FILE).read_text())
    found = charts(page)
    assert sorted(found) == ["chart-accuracy", "chart-end-reasons", "chart-tool-calls"]

    accuracy = found["chart-accuracy"]
    # scripted_benchmark: src_a = mc-1 (1 of 2 correct) and mc-2 (0 of 2); num-1 and vid-1 alone
    assert [(label, value) for label, value, _ in bars(accuracy)] == [
        ("src_a", 0.25),
        ("src_b", 1.0),
        ("src_video", 0.5),
    ]
    axis = ticks(accuracy)
    assert sorted(axis) == [0, 0.25, 0.5, 0.75, 1]
    zero, one = int(axis[0].get("x1")), int(axis[1].get("x1"))
    for _, value, rect in bars(accuracy):
        x, _, width, _ = geometry(rect)
        assert x == zero and width == round(value * (one - zero))
        assert rect.get("fill") == ACCURACY_COLOUR
    notes = "".join(accuracy.itertext())
    assert "0.250 (2 tasks, 4 rollouts)" in notes and "1.000 (1 task, 2 rollouts)" in notes

    tool_calls = found["chart-tool-calls"]
    assert [(label, value) for label, value, _ in bars(tool_calls)] == [("0", 6), ("1", 2)]
    assert results["tool_calls"]["distribution"] == {"0": 6, "1": 2}
    axis = ticks(tool_calls)
    top = max(axis)
    assert top >= 6 and all(tick == int(tick) for tick in axis)
    floor, ceiling = int(axis[0].get("y1")), int(axis[top].get("y1"))
    for _, value, rect in bars(tool_calls):
        _, y, _, height = geometry(rect)
        assert y + height == floor and height == round(value / top * (floor - ceiling))

    end_reasons = found["chart-end-reasons"]
    drawn = {label: value for label, value, _ in bars(end_reasons)}
    assert drawn == results["end_reasons"] == {"DONE": 6, "ERROR_IN_ACTION": 2}
    assert [rect.get("fill") for _, _, rect in bars(end_reasons)] == [DONE_COLOUR, OTHER_END_COLOUR]
    widths = {label: geometry(rect)[2] for label, _, rect in bars(end_reasons)}
    assert widths["DONE"] == 3 * widths["ERROR_IN_ACTION"] > 0
    assert "6 (75%)" in "".join(end_reasons.itertext())


def test_charts_fill_empty_bins_escape_names_and_are_left_out_without_data():
    results = {
        "per_data_source": {"<b>x</b>": {"accuracy": 0.5}, "plain": {"accuracy": 0.0}},
        "tool_calls": {"distribution": {"0": 3, "3": 5}},
        "end_reasons": {"OVER_LENGTH": 1},
    }
    page = render_report(results, [])
    found = charts(page)
    assert [(label, value) for label, value, _ in bars(found["chart-tool-calls"])] == [
        ("0", 3),
        ("1", 0),
        ("2", 0),
        ("3", 5),
    ]
    assert [geometry(rect)[3] == 0 for _, _, rect in bars(found["chart-tool-calls"])] == [False, True, True, False]
    assert [label for label, _, _ in bars(found["chart-accuracy"])] == ["<b>x</b>", "plain"]
    assert geometry(bars(found["chart-accuracy"])[1][2])[2] == 0
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert sorted(ticks(found["chart-end-reasons"])) == [0, 1]
    assert charts(render_report({"settings": {"k": 1}}, [])) == {}


def test_screenshot_shows_every_chart(report, tmp_path):
    """The charts as Chromium paints them: each bar colour covers the area of its bars."""
    shot = tmp_path / "report.png"
    headless_chromium(
        tmp_path / "profile",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={SCREEN[0]},{SCREEN[1]}",
        f"--screenshot={shot}",
        f"file://{report}",
    )
    image = Image.open(shot)
    assert image.size == SCREEN
    pixels = np.asarray(image.convert("RGB")).astype(int)
    found = charts(report.read_text())
    colours = {
        ACCURACY_COLOUR: ["chart-accuracy"],
        TOOL_CALLS_COLOUR: ["chart-tool-calls"],
        DONE_COLOUR: ["chart-end-reasons"],
        OTHER_END_COLOUR: ["chart-end-reasons"],
    }
    for colour, chart_ids in colours.items():
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        painted = np.all(np.abs(pixels - rgb) <= 3, axis=-1)
        sizes = [
            geometry(rect)[2:]
            for chart_id in chart_ids
            for _, _, rect in bars(found[chart_id])
            if rect.get("fill") == colour
        ]
        # Whole-pixel bars; an offset of the page layout may blend their edge pixels.
        assert sum((w - 1) * (h - 1) for w, h in sizes) <= painted.sum() <= sum((w + 1) * (h + 1) for w, h in sizes)
        rows, columns = np.nonzero(painted)
        around = pixels[max(0, rows.min() - 40) : rows.max() + 40, max(0, columns.min() - 60) : columns.max() + 60]
        assert np.all(around < 120, axis=-1).sum() > 50  # the labels and axes beside the bars
