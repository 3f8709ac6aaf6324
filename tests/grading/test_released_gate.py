"""The released answer gate (`extract_answer(gate="first_exact")`) against a reference written
from the released reward function's description, on generated responses: tool outputs that
print answer tags, stray and unclosed tags after the last tool output, run-together blocks,
loose and exact formats, boxes inside the box."""

import itertools
import re

from pyvision_jax.grading.scoring import extract_answer

EXACT = re.compile(r"<answer>\n\\boxed\{(.*?)\}\n</answer>", re.DOTALL)


def released_answer(response: str) -> str | None:
    """The released rule: a format error (nothing read) when the text after the last
    `</interpreter>` holds a different number of `<answer>` and `</answer>`; else the first
    exact `<answer>\\n\\boxed{X}\\n</answer>` of the whole response, X stripped, void when it
    holds `<interpreter>`, `<answer>` or `\\boxed` or has 1000 characters or more."""
    final = response.split("</interpreter>")[-1]
    if final.count("<answer>") != final.count("</answer>"):
        return None
    match = EXACT.search(response)
    if match is None:
        return None
    answer = match.group(1).strip()
    if "<interpreter>" in answer or "<answer>" in answer or "\\boxed" in answer or len(answer) >= 1000:
        return None
    return answer


TOOL_OUTPUTS = (
    "",
    "<interpreter>\nText Result:\n7\n</interpreter>\n",
    "<interpreter>\nText Result:\n<answer>\n\\boxed{Z}\n</answer>\n</interpreter>\n",
    "<interpreter>\nText Result:\n<answer>\n</interpreter>\n",
    "<interpreter>\nText Result:\n</answer></interpreter>\n",
)
BEFORE = ("", "I think so. ", "<answer>", "</answer>", "<answer>\n\\boxed{C}\n</answer>\n")
BLOCKS = (
    "<answer>\n\\boxed{A}\n</answer>",
    "<answer>\n\\boxed{ A }\n</answer>",
    "<answer>\\boxed{A}</answer>",
    "<answer>\n\\boxed{A} or \\boxed{B}\n</answer>",
    "<answer>\n\\boxed{A}</answer><answer>\n\\boxed{B}\n</answer>",
    "<answer>\n\\boxed{\\frac{1}{2}}\n</answer>",
    "<answer>\n\\boxed{" + "x" * 1000 + "}\n</answer>",
    "\\boxed{A}",
    "",
)
AFTER = ("", "\n<answer>", "\n</answer>", "\n<answer>\n\\boxed{B}\n</answer>", "<answer></answer>", "\n<answer>\n")


def generated_responses():
    for tool, before, block, after in itertools.product(TOOL_OUTPUTS, BEFORE, BLOCKS, AFTER):
        yield tool + before + block + after


def test_the_released_gate_reads_what_the_released_rule_reads_on_generated_responses():
    responses = list(generated_responses())
    differ = [r for r in responses if extract_answer(r, gate="first_exact") != released_answer(r)]
    assert not differ, f"{len(differ)} of {len(responses)} differ, e.g. {differ[0]!r}"
    unbalanced = [r for r in responses if released_answer(r) is None and EXACT.search(r)]
    assert len(responses) == 1350 and len(unbalanced) > 300


def test_unbalanced_answer_tags_after_the_last_tool_output_read_nothing():
    assert extract_answer("<answer>\n\\boxed{A}\n</answer>\n<answer>", gate="first_exact") is None
    assert extract_answer("<answer>\n\\boxed{A}\n</answer>\n<answer>", gate="last") == "A"
    printed = "<interpreter>\nText Result:\n<answer>\n</interpreter>\n<answer>\n\\boxed{A}\n</answer>"
    assert extract_answer(printed, gate="first_exact") == "A"
