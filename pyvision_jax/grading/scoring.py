"""Host-side answer checking: extraction of the final answer and per-type scorers.

Every scorer takes the full model response and the ground truth and returns a `Score`.
A response can never crash a scorer: anything unparseable scores 0. A malformed ground
truth, on the other hand, is a data error and raises `GroundTruthError` naming the value.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import threading
from typing import Callable, Sequence

INTERPRETER_CLOSE = "</interpreter>"
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
BOXED_COMMAND = "\\boxed"

MRA_TOLERANCES_IN_TWENTIETHS = tuple(range(10, 0, -1))
"""1 - theta for theta in {0.50, 0.55, ..., 0.95}, in units of 1/20 so comparisons are exact."""
MRA_FLOAT_TOLERANCES = tuple(1 - (0.5 + 0.05 * i) for i in range(10))
"""The released code's 1 - theta, computed in floats: 1 - 0.7 is 0.30000000000000004, so a
relative error of exactly 0.3 passes that threshold (10 vs 7 or 13 scores 0.5, not 0.4)."""
MRA_THRESHOLDS = ("exact", "float")
ANSWER_GATES = ("last", "first_exact")
RELEASED_ANSWER = re.compile(r"<answer>\n\\boxed\{(.*?)\}\n</answer>", re.DOTALL)
"""The released answer gate: `<answer>`, newline, `\\boxed{`, the shortest text up to
`}`, newline, `</answer>`; searched over the whole response."""
RELEASED_REJECTED = ("<interpreter>", ANSWER_OPEN, BOXED_COMMAND)
"""Text that voids a released answer: what two boxes, or two answer blocks run together, leave
inside the shortest match."""
RELEASED_MAX_ANSWER_CHARS = 1000
"""The released judge scorer's cap: a longer answer scores 0."""


class GroundTruthError(ValueError):
    """The ground truth of a task cannot be interpreted by the scorer of its answer type."""


class ScorerUnavailableError(RuntimeError):
    """A scorer's external service (e.g. an LLM judge) could not be reached."""


@dataclasses.dataclass(frozen=True)
class Score:
    """Result of checking one response: score in [0, 1], correctness, and the extracted answer."""

    score: float
    correct: bool
    extracted: str | None


ZERO_SCORE = Score(score=0.0, correct=False, extracted=None)


# ----------------------------------------------------------------------------- extraction


def _final_turn(response: str) -> str:
    """The text after the last tool output; answers quoted inside tool outputs never count."""
    cut = response.rfind(INTERPRETER_CLOSE)
    return response if cut < 0 else response[cut + len(INTERPRETER_CLOSE) :]


def _braced_content(text: str, open_index: int) -> tuple[str, int] | None:
    """Content of the balanced `{...}` group opening at `open_index`, and the index after it."""
    if open_index >= len(text) or text[open_index] != "{":
        return None
    depth = 0
    index = open_index
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text) and text[index + 1] in "{}":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index], index + 1
        index += 1
    return None


def _boxed_groups(text: str) -> list[tuple[int, int, str]]:
    """All `\\boxed{...}` groups as (start, end, content); unbalanced ones are skipped."""
    groups = []
    start = text.find(BOXED_COMMAND)
    while start >= 0:
        brace = start + len(BOXED_COMMAND)
        while brace < len(text) and text[brace] == " ":
            brace += 1
        parsed = _braced_content(text, brace)
        if parsed is not None:
            content, end = parsed
            groups.append((start, end, content))
            start = text.find(BOXED_COMMAND, end)
        else:
            start = text.find(BOXED_COMMAND, start + len(BOXED_COMMAND))
    return groups


def _strict_boxed(block: str) -> str | None:
    """The content when the block is exactly one `\\boxed{...}` (surrounding whitespace allowed)."""
    stripped = block.strip()
    groups = _boxed_groups(stripped)
    if len(groups) != 1:
        return None
    start, end, content = groups[0]
    if start != 0 or end != len(stripped):
        return None
    return content.strip() or None


def _released_gate(response: str) -> str | None:
    """The released gate: the FIRST `<answer>\\n\\boxed{X}\\n</answer>` anywhere in the
    response (a tool output the model's code printed included); nothing when, after the last
    `</interpreter>`, `<answer>` and `</answer>` occur a different number of times (its format
    error: `<answer>\\n\\boxed{A}\\n</answer>\\n<answer>` reads nothing); X is void when it
    holds `<interpreter>`, `<answer>` or `\\boxed` (`<answer>\\n\\boxed{A} or \\boxed{B}\\n</answer>`
    reads "A} or \\boxed{B") or has 1000 characters or more."""
    final = _final_turn(response)
    if final.count(ANSWER_OPEN) != final.count(ANSWER_CLOSE):
        return None
    match = RELEASED_ANSWER.search(response)
    if match is None:
        return None
    answer = match.group(1).strip()
    if any(text in answer for text in RELEASED_REJECTED) or len(answer) >= RELEASED_MAX_ANSWER_CHARS:
        return None
    return answer or None


def extract_answer(response: str, *, strict: bool = True, gate: str = "last") -> str | None:
    """The final answer of a response, or None when absent or malformed.

    Gate "last" (ours), strict: the last `<answer>...</answer>` block after the last
    `</interpreter>` must hold exactly one `\\boxed{X}` (the prompt asks for
    `<answer>\\n\\boxed{X}\\n</answer>`; surrounding whitespace is tolerated). Lenient: the
    last `\\boxed{X}` inside the last answer block (an unclosed final block counts), else the
    last `\\boxed{X}` of the final turn, else the stripped text of the answer block.
    Gate "first_exact" (the released code; `strict` does not apply): the first
    `<answer>\\n\\boxed{X}\\n</answer>` of the whole response, void when X holds another box,
    answer tag or tool output, or when the final turn's answer tags are unbalanced
    (`_released_gate`).
    """
    if gate not in ANSWER_GATES:
        raise ValueError(f"answer gate {gate!r} must be one of {ANSWER_GATES}")
    if not isinstance(response, str):
        return None
    if gate == "first_exact":
        return _released_gate(response)
    final = _final_turn(response)
    blocks = ANSWER_BLOCK.findall(final)
    if strict:
        return _strict_boxed(blocks[-1]) if blocks else None
    last_open = final.rfind(ANSWER_OPEN)
    if last_open >= 0 and (not blocks or final.rfind(ANSWER_CLOSE) < last_open):
        blocks.append(final[last_open + len(ANSWER_OPEN) :])
    if blocks:
        groups = _boxed_groups(blocks[-1])
        answer = groups[-1][2] if groups else blocks[-1]
    else:
        groups = _boxed_groups(final)
        answer = groups[-1][2] if groups else ""
    return answer.strip() or None


# ----------------------------------------------------------------------------- normalization

_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_SPACING_COMMANDS = re.compile(r"\\[,;:! ]|\\quad|\\qquad")


def normalize_text(text: str) -> str:
    """Lower-case, unwrapped, whitespace-collapsed form used for string comparisons."""
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = _SPACING_COMMANDS.sub(" ", text)
    text = text.replace("$", "").replace("\\%", "%")
    text = re.sub(r"\s+", " ", text).strip().lower()
    return text.strip(" .;:!")


# ----------------------------------------------------------------------------- multiple choice

_LETTER_ONLY = re.compile(r"^\(?([a-z])\)?[.:)]?$", re.IGNORECASE)
_LETTER_WITH_TEXT = re.compile(r"^(?:\(([a-z])\)|([a-z])[.:)])\s+\S", re.IGNORECASE)
_OPTION_WORD = re.compile(r"^(?:option|choice|answer)\s*:?\s*\(?([a-z])\)?[.:)]?$", re.IGNORECASE)
_OPTION_LABEL = re.compile(r"^\s*\(?([A-Za-z])\s*[.:)]\s*(.+)$", re.DOTALL)


def _option_texts(options: Sequence[str]) -> list[tuple[str, str]]:
    """(letter, normalized text) per option; labels like "A. cat" are honoured, else A, B, ..."""
    parsed = []
    for position, option in enumerate(options):
        label = _OPTION_LABEL.match(option)
        if label:
            parsed.append((label.group(1).upper(), normalize_text(label.group(2))))
        else:
            parsed.append((chr(ord("A") + position), normalize_text(option)))
    return parsed


def parse_choice(answer: str, options: Sequence[str] | None = None) -> str | None:
    """The option letter an answer names: "B", "(B)", "B.", "B) text", "Option B" or option text."""
    text = _TEXT_WRAPPER.sub(r"\1", answer).replace("$", "").strip()
    if options:
        normalized = normalize_text(text)
        for letter, option_text in _option_texts(options):
            if option_text and normalized == option_text:
                return letter
    for pattern in (_LETTER_ONLY, _OPTION_WORD):
        match = pattern.match(text)
        if match:
            return match.group(1).upper()
    match = _LETTER_WITH_TEXT.match(text)
    if match:
        return (match.group(1) or match.group(2)).upper()
    return None


def score_multiple_choice(
    response: str, ground_truth: str, *, options: Sequence[str] | None = None, strict: bool = True, gate: str = "last"
) -> Score:
    """1 when the extracted answer names the same option as the ground truth."""
    expected = parse_choice(ground_truth, options)
    if expected is None:
        raise GroundTruthError(f"multiple-choice ground truth {ground_truth!r} names no option (options={options!r})")
    extracted = extract_answer(response, strict=strict, gate=gate)
    if extracted is None:
        return ZERO_SCORE
    correct = parse_choice(extracted, options) == expected
    return Score(score=float(correct), correct=correct, extracted=extracted)


# ----------------------------------------------------------------------------- numeric (MRA)

_NUMBER_WORDS = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_LATEX_FRACTION = re.compile(r"^\s*(-?)\\[dt]?frac\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}")
_PLAIN_FRACTION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?![\d.])")
_FIRST_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str) -> float | None:
    """The number an answer states: "12", "-3.5", "1,234", "12 cm", "\\frac{1}{2}", "3/4", "two"."""
    text = _TEXT_WRAPPER.sub(r"\1", text).replace("$", "").strip()
    fraction = _LATEX_FRACTION.match(text)
    if fraction:
        sign = -1.0 if fraction.group(1) else 1.0
        numerator, denominator = float(fraction.group(2)), float(fraction.group(3))
        return sign * numerator / denominator if denominator else None
    fraction = _PLAIN_FRACTION.match(text)
    if fraction:
        denominator = float(fraction.group(2))
        return float(fraction.group(1)) / denominator if denominator else None
    match = _FIRST_NUMBER.search(text)
    if match:
        value = float(match.group(0).replace(",", ""))
        return value if math.isfinite(value) else None
    word = normalize_text(text)
    return float(_NUMBER_WORDS[word]) if word in _NUMBER_WORDS else None


def mean_relative_accuracy(prediction: float, ground_truth: float, thresholds: str = "exact") -> float:
    """MRA: mean over theta in {0.50, ..., 0.95} of 1[|pred - gt| / |gt| < 1 - theta].

    A ground truth of 0 requires an exact match. thresholds "exact" compares in twentieths
    (exact arithmetic); "float" uses the released code's float thresholds (MRA_FLOAT_TOLERANCES).
    """
    if thresholds not in MRA_THRESHOLDS:
        raise ValueError(f"MRA thresholds {thresholds!r} must be one of {MRA_THRESHOLDS}")
    if not math.isfinite(prediction):
        return 0.0
    if ground_truth == 0:
        return 1.0 if prediction == 0 else 0.0
    if thresholds == "float":
        relative = abs(prediction - ground_truth) / abs(ground_truth)
        return sum(relative < t for t in MRA_FLOAT_TOLERANCES) / len(MRA_FLOAT_TOLERANCES)
    error_times_twenty = abs(prediction - ground_truth) * 20
    hits = sum(error_times_twenty < k * abs(ground_truth) for k in MRA_TOLERANCES_IN_TWENTIETHS)
    return hits / len(MRA_TOLERANCES_IN_TWENTIETHS)


def score_numeric(
    response: str, ground_truth: str | float, *, strict: bool = True, gate: str = "last", thresholds: str = "exact"
) -> Score:
    """MRA of the number in the boxed answer; correct when MRA >= 0.5."""
    expected = float(ground_truth) if isinstance(ground_truth, (int, float)) else parse_number(str(ground_truth))
    if expected is None or not math.isfinite(expected):
        raise GroundTruthError(f"numeric ground truth {ground_truth!r} is not a number")
    extracted = extract_answer(response, strict=strict, gate=gate)
    if extracted is None:
        return ZERO_SCORE
    predicted = parse_number(extracted)
    if predicted is None:
        return Score(score=0.0, correct=False, extracted=extracted)
    mra = mean_relative_accuracy(predicted, expected, thresholds)
    return Score(score=mra, correct=mra >= 0.5, extracted=extracted)


# ----------------------------------------------------------------------------- math / free form


def _math_verify_timeout() -> int | None:
    """math-verify's timeout uses SIGALRM, which only the main thread may set."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _as_latex(text: str) -> str:
    return text if "$" in text or BOXED_COMMAND in text else f"${text}$"


def math_equivalent(prediction: str, ground_truth: str) -> bool:
    """Equivalence by math-verify, falling back to normalized string equality."""
    if normalize_text(prediction) == normalize_text(ground_truth):
        return True
    import math_verify  # imported on first use: it pulls in sympy, seconds of start-up

    timeout = _math_verify_timeout()
    gold = math_verify.parse(_as_latex(ground_truth), parsing_timeout=timeout)
    target = math_verify.parse(_as_latex(prediction), parsing_timeout=timeout)
    if not gold or not target:
        return False
    return bool(math_verify.verify(gold, target, timeout_seconds=timeout))


def score_math(response: str, ground_truth: str, *, strict: bool = True, gate: str = "last") -> Score:
    """1 when the boxed answer is mathematically (or, for free text, literally) equivalent."""
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        raise GroundTruthError(f"math/free-form ground truth {ground_truth!r} is empty or not a string")
    extracted = extract_answer(response, strict=strict, gate=gate)
    if extracted is None:
        return ZERO_SCORE
    try:
        correct = math_equivalent(extracted, ground_truth)
    except Exception:  # noqa: BLE001 - math-verify/sympy can fail in many ways on odd input
        correct = False
    return Score(score=float(correct), correct=correct, extracted=extracted)


# ----------------------------------------------------------------------------- registry

SCORERS: dict[str, Callable[..., Score]] = {
    "multiple_choice": score_multiple_choice,
    "numeric": score_numeric,
    "math": score_math,
}


def register_scorer(answer_type: str, scorer: Callable[..., Score]) -> None:
    """Add (or replace) the scorer used for `answer_type`."""
    SCORERS[answer_type] = scorer


def get_scorer(answer_type: str) -> Callable[..., Score]:
    try:
        return SCORERS[answer_type]
    except KeyError:
        raise KeyError(f"unknown answer type {answer_type!r}; known types: {sorted(SCORERS)}") from None


def score_response(response: str, ground_truth: str, answer_type: str, **kwargs) -> Score:
    """Score one response with the scorer registered for `answer_type`.

    Whatever the response, the result is a Score (0 when it cannot be checked). An unknown
    answer type (KeyError), arguments the scorer does not take (TypeError), a ground truth
    the scorer cannot interpret (GroundTruthError) and an unreachable external scorer
    (ScorerUnavailableError) raise.
    """
    scorer = get_scorer(answer_type)
    inspect.signature(scorer).bind(response, ground_truth, **kwargs)
    if not isinstance(response, str):
        return ZERO_SCORE
    try:
        return scorer(response, ground_truth, **kwargs)
    except (GroundTruthError, ScorerUnavailableError):
        raise
    except Exception:  # noqa: BLE001 - no response may crash scoring
        return Score(score=0.0, correct=False, extracted=extract_answer(response, strict=False))
