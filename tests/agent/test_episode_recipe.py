"""The episode's recipe switches in both positions (docs/recipe.md): turn boundary, response
budget, action syntax, image cap, stdout stripping and the observation format, on the
examples docs/recipe.md quotes."""

import pytest

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.prompts import TEXT_RESULT
from pyvision_jax.agent.trajectory import EndReason
from tests.agent.episodes import run_one
from tests.agent.turns import answer_turn, code_turn

RELEASED = dict(
    action_syntax="released",
    turn_boundary="newline",
    image_cap_rule="reach",
    stdout_strip="both",
    observation_format="released",
)


def observation_text(tokenizer, trajectory, turn=0):
    record = trajectory.turns[turn]
    return tokenizer.decode(trajectory.token_ids[record.generated_end : record.observation_end].tolist())


@pytest.mark.parametrize(
    "boundary, start",
    [
        ("im_end", "<|im_end|>\n<|im_start|>user\n<tool_response>\n"),
        ("newline", "\n<|im_start|>user\n<tool_response>\n"),
    ],
)
def test_turn_boundary_after_the_code(tokenizer, image_task, boundary, start):
    t, _, _ = run_one(tokenizer, image_task, [code_turn("print 7"), answer_turn()], turn_boundary=boundary)
    generated = t.turns[0]
    assert tokenizer.decode(t.token_ids[generated.generated_start : generated.generated_end].tolist()).endswith(
        "</code>"
    )
    assert observation_text(tokenizer, t).startswith(start)
    assert observation_text(tokenizer, t).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert t.end_reason is EndReason.DONE


def test_the_response_budget_caps_generation_and_observations(tokenizer, image_task):
    turns = [code_turn("print 7"), answer_turn()]
    free, engine, _ = run_one(tokenizer, image_task, turns)
    assert engine.requests["img/0"][0].max_new_tokens == EpisodeConfig().max_new_tokens_per_turn
    assert free.end_reason is EndReason.DONE
    _, engine, _ = run_one(tokenizer, image_task, turns, max_response_tokens=500)
    assert engine.requests["img/0"][0].max_new_tokens == 500
    first = free.turns[0]
    response_after_observation = first.observation_end - free.prompt_length
    capped, _, _ = run_one(tokenizer, image_task, turns, max_response_tokens=response_after_observation)
    assert capped.end_reason is EndReason.OVER_LENGTH and len(capped.turns) == 1
    fits, engine, _ = run_one(tokenizer, image_task, turns, max_response_tokens=response_after_observation + 40)
    assert engine.requests["img/0"][1].max_new_tokens == 40
    assert fits.end_reason is EndReason.DONE


BARE = "Let me look.\n```python\n#! print bare\n```"
UNFENCED = "Let me look.\n<code>\n#! print unfenced\n</code>"
PY_FENCE = "Let me look.\n<code>\n```py\n#! print py\n```\n</code>"
EMPTY_ANSWER = "<answer></answer>\n" + code_turn("print after empty")
UNCLOSED_ANSWER = "<answer>\n\\boxed{3}\n" + code_turn("print after unclosed")


@pytest.mark.parametrize(
    "turn, ours, released",
    [
        (BARE, EndReason.ERROR_IN_ACTION, EndReason.DONE),
        (UNFENCED, EndReason.DONE, EndReason.ERROR_IN_ACTION),
        (PY_FENCE, EndReason.DONE, EndReason.ERROR_IN_ACTION),
        (EMPTY_ANSWER, EndReason.DONE, EndReason.DONE),
        (UNCLOSED_ANSWER, EndReason.ERROR_IN_ACTION, EndReason.DONE),
    ],
)
def test_action_syntax(tokenizer, image_task, turn, ours, released):
    tagged, _, _ = run_one(tokenizer, image_task, [turn, answer_turn()])
    assert tagged.end_reason is ours
    old, _, _ = run_one(tokenizer, image_task, [turn, answer_turn()], action_syntax="released")
    assert old.end_reason is released
    ran = old.num_successful_tool_calls == 1
    assert ran == (released is EndReason.DONE)
    if ran:
        assert len(old.turns) == 2 and "Text Result:\n" in observation_text(tokenizer, old)


def test_an_empty_answer_ends_our_episode_but_runs_the_code_in_the_released_one(tokenizer, image_task):
    ours, _, pool = run_one(tokenizer, image_task, [EMPTY_ANSWER, answer_turn()])
    assert ours.final_answer == "" and ours.num_tool_calls == 0 and pool.acquired == []
    released, _, _ = run_one(tokenizer, image_task, [EMPTY_ANSWER, answer_turn()], action_syntax="released")
    assert "after empty" in observation_text(tokenizer, released)
    assert released.final_answer == "\\boxed{A}"


@pytest.mark.parametrize(
    "rule, reason, turns", [("exceed", EndReason.DONE, 2), ("reach", EndReason.EXCEED_MAX_IMAGES, 1)]
)
def test_image_cap(tokenizer, image_task, rule, reason, turns):
    t, _, _ = run_one(
        tokenizer, image_task, [code_turn("images 2 64x48"), answer_turn()], max_images=3, image_cap_rule=rule
    )
    assert t.end_reason is reason and len(t.turns) == turns
    over, _, _ = run_one(
        tokenizer, image_task, [code_turn("images 3 64x48"), answer_turn()], max_images=3, image_cap_rule=rule
    )
    assert over.end_reason is EndReason.EXCEED_MAX_IMAGES


@pytest.mark.parametrize(
    "strip, text", [("right", "Text Result:\n  padded\nImage Result:"), ("both", "Text Result:\npadded\nImage Result:")]
)
def test_stdout_strip(tokenizer, image_task, strip, text):
    t, _, _ = run_one(tokenizer, image_task, [code_turn("print   padded"), answer_turn()], stdout_strip=strip)
    assert text in observation_text(tokenizer, t)


def test_the_released_positions_together(tokenizer, image_task):
    t, _, _ = run_one(tokenizer, image_task, [BARE, answer_turn()], **RELEASED)
    assert t.end_reason is EndReason.DONE
    assert observation_text(tokenizer, t).startswith(
        "\n<|im_start|>user\n<tool_response>\n<interpreter>\nText Result:\nbare</interpreter>\n\n</tool_response>"
    )


@pytest.mark.parametrize(
    "observation_format, text_only, with_image",
    [
        (
            "full",
            "<interpreter>\nText Result:\n7\nImage Result:\n</interpreter>\n\n</tool_response>",
            "<interpreter>\nText Result:\ndrawn\nImage Result:\n<image_clue_1><|vision_start|>",
        ),
        (
            "released",
            "<interpreter>\nText Result:\n7</interpreter>\n\n</tool_response>",
            "<interpreter>Text Result:\ndrawn\nImage Result:\n<image_clue_1><|vision_start|>",
        ),
    ],
)
def test_observation_format(tokenizer, image_task, observation_format, text_only, with_image):
    printed, _, _ = run_one(
        tokenizer, image_task, [code_turn("print 7"), answer_turn()], observation_format=observation_format
    )
    shown = observation_text(tokenizer, printed)
    assert text_only in shown and ("Image Result:" in shown) == (observation_format == "full")
    drawn, _, _ = run_one(
        tokenizer,
        image_task,
        [code_turn("print drawn", "images 1 64x48"), answer_turn()],
        observation_format=observation_format,
    )
    shown = observation_text(tokenizer, drawn)
    assert with_image in shown and shown.count("Image Result:") == 1
    assert shown.endswith("</image_clue_1></interpreter>\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert [TEXT_RESULT.search(observation_text(tokenizer, t)).group(1) for t in (printed, drawn)] == ["7", "drawn"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("action_syntax", "loose"),
        ("turn_boundary", "eos"),
        ("image_cap_rule", "never"),
        ("stdout_strip", "left"),
        ("observation_format", "short"),
        ("max_response_tokens", -1),
    ],
)
def test_bad_switch_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"EpisodeConfig.{field}"):
        EpisodeConfig(**{field: value})
