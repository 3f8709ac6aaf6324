"""The HTML report opened in headless Chromium: every trajectory shown, no script errors,
hostile model text inert, filters working."""

import html
import re
import shutil
import subprocess

import pytest

from pyvision_jax.eval.records import REPORT_FILE, RESULTS_FILE, TRAJECTORIES_FILE
from pyvision_jax.eval.report import render_report, write_report
from tests.eval.scripted_benchmark import HOSTILE, run_scripted_evaluation

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def report(tokenizer, benchmark, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run_scripted_evaluation(tokenizer, benchmark, out, seed=0)
    return out / REPORT_FILE


def dump_dom(path, profile, fragment=""):
    """The DOM after load, as headless Chromium serializes it."""
    assert shutil.which(CHROMIUM), "Debian's chromium is required (apt-get install chromium)"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
               "--dump-dom", f"file://{path}{fragment}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


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
    # task images (3 image tasks x 2) + code images (1 + 2): all inline, nothing fetched
    assert dom.count('src="data:image/png;base64,') == 6 + 3
    assert not re.search(r'(src|href)="(?!data:)', dom)


def test_hostile_model_text_is_shown_but_never_runs(dom):
    body_tag = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body_tag
    assert html.escape(HOSTILE, quote=False) in dom
    assert "<script>document.body" not in dom


def test_fragment_filters_by_correctness_and_source(report, tmp_path):
    dom = dump_dom(report, tmp_path / "profile", "#correct=1&source=src_a")
    assert element_text(dom, "js-errors") == ""
    assert element_text(dom, "shown-count") == "1"
    visible = re.findall(r'<section class="trajectory correct" id="[^"]+" data-correct="1" '
                         r'data-source="src_a">', dom)
    assert len(visible) == 1
    assert len(re.findall(r'<section class="trajectory \w+ hidden"', dom)) == 7


def test_report_escapes_every_model_field():
    record = {"task_id": "<i>t</i>", "data_source": '"><script>x()</script>', "rollout_index": 0,
              "score": 1.0, "correct": True, "end_reason": "DONE",
              "task": {"question": "<b>q</b>", "answer": "<u>A</u>", "options": ["<s>o</s>"],
                       "image_path": "<p>.png"},
              "prompt": "</pre><script>p()</script>", "extracted": "<em>A</em>",
              "turns": [{"text": "<h1>r</h1>", "code": "</pre><script>c()</script>",
                         "action": "code", "finish_reason": "stop",
                         "interpreter_text": "<script>i()</script>", "image_labels": [1],
                         "tool_error": "<script>e()</script>"}],
              "images": [{"label": 1, "source": "code", "num_tokens": 4,
                          "png_base64": 'AAAA" onerror="x()'}]}
    page = render_report({"settings": {"k": 1, "note": "<script>s()</script>"}}, [record])
    assert page.count("<script>") == 1  # the report's own
    for tag in ("<i>", "<b>q", "<u>", "<s>", "<p>", "<h1>r", "<em>", '"><script'):
        assert tag not in page
    for text in ("&lt;i&gt;t&lt;/i&gt;", "&lt;h1&gt;r&lt;/h1&gt;", "&lt;script&gt;i()",
                 "&lt;/pre&gt;&lt;script&gt;c()", "&quot;&gt;&lt;script&gt;x()"):
        assert text in page
    assert "[image data not valid base64]" in page and "onerror" not in page


def test_script_errors_would_be_reported(report, tmp_path):
    """The error capture is live: a failing script after the report's own shows up."""
    broken = tmp_path / "broken.html"
    broken.write_text(report.read_text().replace("</body>",
                                                 "<script>null.missing();</script></body>"))
    dom = dump_dom(broken, tmp_path / "profile")
    assert "null" in element_text(dom, "js-errors")


def test_report_can_show_fewer_rollouts_per_task(report, tmp_path):
    for name in (RESULTS_FILE, TRAJECTORIES_FILE):
        (tmp_path / name).write_bytes((report.parent / name).read_bytes())
    page = write_report(tmp_path, max_rollouts_per_task=1).read_text()
    assert re.findall(r"<b>([\w-]+)</b> rollout (\d)<", page) == [
        ("mc-1", "0"), ("num-1", "0"), ("vid-1", "0"), ("mc-2", "0")]
