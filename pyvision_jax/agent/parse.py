"""Reading the model's action out of one assistant turn.

The protocol (docs/design.md): code is ``<code>\\n```python\\n...\\n```\\n</code>``; the final answer
is ``<answer>\\n\\boxed{...}\\n</answer>``. An answer ends the episode even when the turn also
contains code; otherwise the LAST complete code block is the one that runs. Anything else is a
malformed action, classified so the episode can report (or feed back) what went wrong.

Two syntaxes (``episode.action_syntax``). "tagged" (ours): code needs ``<code>``, its fence may
be ```` ```python ````, ```` ```py ````, bare, or absent; any closed answer block ends the
episode. "released" (the released code): the last ```` ```python ```` fenced block runs,
with or without ``<code>``; ``<code>`` holding no ```` ```python ```` fence is an error; only a
closed, non-empty ``<answer>`` block is an answer, so an empty ``<answer></answer>`` or an
unclosed ``<answer>`` followed by code runs the code.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)
_CODE_RE = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE), re.DOTALL)
_FENCE_RE = re.compile(r"^\s*```(?:python|py)?[ \t]*\n(.*?)\n?[ \t]*```\s*$", re.DOTALL)
_PYTHON_FENCE_RE = re.compile(r"```python\n(.*?)```", re.DOTALL)
ACTION_SYNTAXES = ("tagged", "released")


class ActionKind(enum.Enum):
    ANSWER = "answer"
    CODE = "code"
    NO_CODE_NOR_ANSWER = "no_code_nor_answer"
    UNTERMINATED_BLOCK = "unterminated_block"
    EMPTY_CODE = "empty_code"
    UNFENCED_CODE = "unfenced_code"

    @property
    def malformed(self) -> bool:
        return self not in (ActionKind.ANSWER, ActionKind.CODE)


_FEEDBACK = {
    ActionKind.NO_CODE_NOR_ANSWER: "Format error: the reply has neither a <code> block nor an <answer> block.",
    ActionKind.UNTERMINATED_BLOCK: "Format error: a <code> or <answer> block (or its ```python fence) is not closed.",
    ActionKind.EMPTY_CODE: "Format error: the <code> block contains no code.",
    ActionKind.UNFENCED_CODE: "Format error: the code is not in a ```python fence.",
}


@dataclass(frozen=True)
class Action:
    """The parsed action of one turn: ``code`` for CODE, ``answer`` (the text between the
    answer tags, stripped) for ANSWER, neither for malformed kinds."""

    kind: ActionKind
    code: str | None = None
    answer: str | None = None

    @property
    def feedback(self) -> str:
        """The format-error message shown to the model for a malformed action."""
        return _FEEDBACK[self.kind]


def parse_action(text: str, syntax: str = "tagged") -> Action:
    """Classifies one assistant turn under ``syntax`` (see the module docstring)."""
    if syntax not in ACTION_SYNTAXES:
        raise ValueError(f"action syntax {syntax!r} must be one of {ACTION_SYNTAXES}")
    return _parse_released(text) if syntax == "released" else _parse_tagged(text)


def _parse_released(text: str) -> Action:
    answers = [a.strip() for a in _ANSWER_RE.findall(text) if a.strip()]
    if answers:
        return Action(ActionKind.ANSWER, answer=answers[-1])
    blocks = _PYTHON_FENCE_RE.findall(text)
    if blocks:
        code = blocks[-1]
        return Action(ActionKind.CODE, code=code) if code.strip() else Action(ActionKind.EMPTY_CODE)
    return Action(ActionKind.UNFENCED_CODE if CODE_OPEN in text else ActionKind.NO_CODE_NOR_ANSWER)


def _parse_tagged(text: str) -> Action:
    answers = _ANSWER_RE.findall(text)
    if answers:
        return Action(ActionKind.ANSWER, answer=answers[-1].strip())
    if ANSWER_OPEN in text:
        return Action(ActionKind.UNTERMINATED_BLOCK)
    if CODE_OPEN not in text:
        return Action(ActionKind.NO_CODE_NOR_ANSWER)
    if text.rfind(CODE_OPEN) > text.rfind(CODE_CLOSE):
        return Action(ActionKind.UNTERMINATED_BLOCK)
    body = _CODE_RE.findall(text)[-1]
    fenced = _FENCE_RE.match(body)
    if fenced is None:
        if "```" in body:
            return Action(ActionKind.UNTERMINATED_BLOCK)
        code = body
    else:
        code = fenced.group(1)
    if not code.strip():
        return Action(ActionKind.EMPTY_CODE)
    return Action(ActionKind.CODE, code=code)
