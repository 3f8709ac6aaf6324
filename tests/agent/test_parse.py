import pytest

from pyvision_jax.agent.parse import ActionKind, parse_action

CODE = "<code>\n```python\n{}\n```\n</code>"


def test_single_code_block():
    action = parse_action("I will crop.\n" + CODE.format("x = 1\nprint(x)"))
    assert action.kind is ActionKind.CODE and action.code == "x = 1\nprint(x)"


def test_the_last_code_block_runs():
    text = CODE.format("first()") + "\nthen\n" + CODE.format("second()")
    assert parse_action(text).code == "second()"


def test_answer_ends_the_episode_even_with_code():
    text = "<answer>\n\\boxed{B}\n</answer>\n" + CODE.format("print(1)")
    action = parse_action(text)
    assert action.kind is ActionKind.ANSWER and action.answer == "\\boxed{B}"
    assert action.code is None
    assert parse_action(CODE.format("print(1)") + "<answer>7</answer>").answer == "7"


@pytest.mark.parametrize(
    "text, kind",
    [
        ("The answer is clearly red.", ActionKind.NO_CODE_NOR_ANSWER),
        ("```python\nprint(1)\n```", ActionKind.NO_CODE_NOR_ANSWER),
        ("", ActionKind.NO_CODE_NOR_ANSWER),
        ("<code>\n```python\nprint(1)\n", ActionKind.UNTERMINATED_BLOCK),
        ("<code>\n```python\nprint(1)\n</code>", ActionKind.UNTERMINATED_BLOCK),
        (CODE.format("a()") + "<code>\n```python\nb()", ActionKind.UNTERMINATED_BLOCK),
        ("<answer>\n\\boxed{3", ActionKind.UNTERMINATED_BLOCK),
        (CODE.format(""), ActionKind.EMPTY_CODE),
        (CODE.format("   \n  "), ActionKind.EMPTY_CODE),
        ("<code></code>", ActionKind.EMPTY_CODE),
    ],
)
def test_malformed_actions_are_classified(text, kind):
    action = parse_action(text)
    assert action.kind is kind and action.kind.malformed
    assert action.code is None and action.answer is None
    assert action.feedback.startswith("Format error")


def test_fence_without_language_and_bare_code_are_accepted():
    assert parse_action("<code>\n```\nprint(2)\n```\n</code>").code == "print(2)"
    assert parse_action("<code>\nprint(3)\n</code>").code.strip() == "print(3)"


@pytest.mark.parametrize(
    "text, tagged, released",
    [
        ("```python\nprint(1)\n```", ActionKind.NO_CODE_NOR_ANSWER, ActionKind.CODE),
        ("<code>\nprint(1)\n</code>", ActionKind.CODE, ActionKind.UNFENCED_CODE),
        ("<code>\n```py\nprint(1)\n```\n</code>", ActionKind.CODE, ActionKind.UNFENCED_CODE),
        ("<answer></answer>\n" + CODE.format("print(2)"), ActionKind.ANSWER, ActionKind.CODE),
        ("<answer>\n\\boxed{3}\n" + CODE.format("print(2)"), ActionKind.UNTERMINATED_BLOCK, ActionKind.CODE),
        ("<answer>\n\\boxed{3}\n", ActionKind.UNTERMINATED_BLOCK, ActionKind.NO_CODE_NOR_ANSWER),
        ("<answer>\n\\boxed{B}\n</answer>" + CODE.format("print(1)"), ActionKind.ANSWER, ActionKind.ANSWER),
        (CODE.format("  "), ActionKind.EMPTY_CODE, ActionKind.EMPTY_CODE),
    ],
)
def test_released_syntax_against_ours(text, tagged, released):
    assert parse_action(text).kind is tagged
    assert parse_action(text, "released").kind is released


def test_released_syntax_runs_the_last_python_block():
    text = "```python\nfirst()\n```\n<code>\n```python\nsecond()\n```\n</code>"
    assert parse_action(text, "released").code == "second()\n"
    assert parse_action("<answer>  </answer>" + CODE.format("x()"), "released").code == "x()\n"
    assert parse_action("<code>\nx\n</code>", "released").feedback.startswith("Format error")
    with pytest.raises(ValueError, match="action syntax 'loose'"):
        parse_action("", "loose")
