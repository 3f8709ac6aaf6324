"""The shell commands of README.md and docs/*.md, and how the docs-commands test runs each in
miniature: the documented words, with its paths moved under a scratch directory, its hosts on
loopback, and named flags set to CPU sizes."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INTERPRETERS = ("python", "python3", ".venv/bin/python")
# The absolute paths the docs use for a user's own files; a miniature puts them under its scratch dir.
USER_ROOTS = ("models", "data", "runs", "shared", "tmp", "prompts")
USER_PATH = re.compile(r"(?<![\w./])/(" + "|".join(USER_ROOTS) + r")/")


@dataclass(frozen=True)
class DocCommand:
    """One command as a reader copies it: continuations joined, comments dropped, `&&` split."""

    text: str
    where: str  # "README.md:16"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_commands() -> list[DocCommand]:
    commands = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for block in SHELL_FENCE.finditer(text):
            first_line = text.count("\n", 0, block.start()) + 2
            logical: list[tuple[int, str]] = []
            pending = ""
            for offset, line in enumerate(block.group(1).splitlines()):
                if pending == "":
                    start = first_line + offset
                pending += line
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                    continue
                logical.append((start, pending))
                pending = ""
            for line_number, line in logical:
                words = strip_comment(line)
                for part in (p.strip() for p in words.split(" && ")):
                    if part:
                        commands.append(DocCommand(" ".join(part.split()), f"{path.relative_to(ROOT)}:{line_number}"))
    return commands


def strip_comment(line: str) -> str:
    """The line without a trailing `# ...` comment (a `#` outside quotes that starts a word)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


@dataclass(frozen=True)
class Miniature:
    """How the test runs a documented command: flags set (`--flag` -> value; None drops the flag),
    flags added, words replaced (a documented placeholder -> a path), extra environment, and the
    documented commands whose outputs it reads (`after`: run first, once, when not yet run)."""

    set: dict[str, str | None] = field(default_factory=dict)
    add: tuple[str, ...] = ()
    replace: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 900
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class CannotRun:
    """A command this machine cannot run, with the one reason."""

    reason: str


def miniature_argv(command: str, plan: Miniature, scratch: Path, hosts: dict[str, str], python: str) -> list[str]:
    """The documented words with the plan applied; paths and hosts substituted."""
    text = command
    for placeholder, value in hosts.items():
        text = text.replace(placeholder, value)
    text = USER_PATH.sub(lambda m: f"{scratch}/{m.group(1)}/", text)
    text = re.sub(r"(?<![\w./])workdir/", f"{scratch}/workdir/", text)
    words = shlex.split(text.replace("[", "").replace("]", "") if text.count("[--") else text)
    words = [plan.replace.get(w, w) for w in words]
    if words and words[0] in INTERPRETERS:
        words[0] = python
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, _ = word.partition("=")
        if name in plan.set:
            seen.add(name)
            takes_next = not eq and i + 1 < len(words) and not words[i + 1].startswith("--")
            i += 2 if takes_next else 1
            if plan.set[name] is not None:
                out.append(f"{name}={plan.set[name]}")
            continue
        out.append(word)
        i += 1
    out += [f"{name}={value}" for name, value in plan.set.items() if name not in seen and value is not None]
    return out + list(plan.add)
