"""The documentation a newcomer reads: README.md stays short with both commands up front, every
relative link in README.md, docs/*.md and ARCHITECTURE.md reaches a file (and a heading) inside
the repository, and none of them, nor the docstrings and comments of the code, narrates the
project's history."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.test_architecture import LAYERS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL_AND_TRAIN = (
    "bash scripts/install.sh && .venv/bin/python launch/train.py --config configs/tiny_cpu.py "
    "--workdir workdir/tiny_cpu"
)
TEST_COMMAND = "bash scripts/test.sh"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)

HISTORY = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a work session": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "acceptance talk": re.compile(r"\bacceptance\b", re.IGNORECASE),
    "a superseded state": re.compile(r"\bpreviously\b", re.IGNORECASE),
}
# In code "session" is also a pytest scope and the sandbox's Python session: only numbered ones count.
CODE_HISTORY = {
    **{k: v for k, v in HISTORY.items() if k != "a work session"},
    "a work session": re.compile(
        r"\b(?:\d+(?:st|nd|rd|th)|first|second|third|fourth|fifth|sixth|seventh|"
        r"eighth|ninth|tenth|eleventh|twelfth)\s+session\b",
        re.IGNORECASE,
    ),
}
CODE_DIRS = ("pyvision_jax", "tests", "benchmarks", "launch", "configs", "scripts")


def doc_files() -> list[Path]:
    return [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8")))}


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8"))) if not EXTERNAL.match(t)]


def test_readme_is_short_and_starts_with_both_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    head = "\n".join(lines[:40])
    assert INSTALL_AND_TRAIN in head, "the install-and-train command is not in README.md's first 40 lines"
    assert TEST_COMMAND in head, "the test command is not in README.md's first 40 lines"


def test_the_doc_set_is_complete():
    names = {p.name for p in doc_files()}
    for name in ("design.md", "learning.md", "fleet.md", "scaling.md", "performance.md", "recipe.md"):
        assert name in names, f"docs/{name} is missing"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(path):
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_narrate_no_history(path):
    text = path.read_text(encoding="utf-8")
    found = [
        f"{what}: {m.group(0)!r} (line {text.count(chr(10), 0, m.start()) + 1})"
        for what, pattern in HISTORY.items()
        for m in pattern.finditer(text)
    ]
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def code_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append((getattr(node, "lineno", 1), doc))
    return texts


def test_code_docstrings_and_comments_narrate_no_history():
    found = []
    for directory in CODE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            for line, text in code_texts(path):
                found += [
                    f"{path.relative_to(ROOT)}:{line}: {what}: {m.group(0)!r}"
                    for what, pattern in CODE_HISTORY.items()
                    for m in pattern.finditer(text)
                ]
    assert not found, "\n".join(found)


def test_the_link_checker_sees_what_a_reader_sees(tmp_path):
    """Links inside code are not links; anchors follow GitHub's heading slugs."""
    page = tmp_path / "page.md"
    page.write_text(
        "# 7B memory: the step\n[a](other.md#x) `[b](c.md)`\n```\n[d](e.md)\n```\n![f](fig.png)\n", encoding="utf-8"
    )
    assert relative_links(page) == ["other.md#x", "fig.png"]
    assert anchors(page) == {"7b-memory-the-step"}
    assert HISTORY["a commit hash"].search("at 7a724f4") and not HISTORY["a commit hash"].search("1000000 facade")


def test_code_scan_reads_comments_and_docstrings_only(tmp_path):
    """A history word in a comment or docstring is found; the same word in code is not."""
    module = tmp_path / "module.py"
    module.write_text('"""Docstring of issue 17."""\nx = "Acceptance"  # the eighth session\n', encoding="utf-8")
    texts = code_texts(module)
    assert [line for line, _ in texts] == [2, 1]
    hits = [what for _, text in texts for what, pattern in CODE_HISTORY.items() if pattern.search(text)]
    assert sorted(hits) == ["a work session", "an issue number"]


def test_architecture_lists_the_packages_once_in_layer_order():
    """ARCHITECTURE.md's "Who owns what" is the one list of packages: every layer of
    tests/test_architecture.py, in its order; README.md and docs/design.md link to it."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text.split("## Who owns what", 1)[1].split("\n## ", 1)[0]
    owners = re.findall(r"^\|.*\| `(\w+)/` \|$", table, re.MULTILINE)
    assert owners == list(LAYERS), f"ARCHITECTURE.md's table lists {owners}, the layers are {list(LAYERS)}"
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    data_flow = design.split("## Data flow", 1)[1].split("\n## ", 1)[0]
    assert "ARCHITECTURE.md#data-flow" in data_flow and not FENCE.search(data_flow), "design.md draws the data flow"
