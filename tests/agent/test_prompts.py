import pytest

from pyvision_jax.agent.prompts import (
    ChatRenderer,
    format_question,
    image_prompt_messages,
    observation_content,
    video_prompt_messages,
)
from pyvision_jax.data.tasks import Task, VideoInfo

PAD = 2012


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_image_prompt_puts_the_image_in_context_with_its_size(tokenizer, image_task):
    renderer = ChatRenderer(tokenizer)
    ids = renderer.prompt_ids(image_prompt_messages(image_task, 1280, 960), [[1, 4, 6]])
    assert ids.count(PAD) == 6
    start = ids.index(PAD)
    assert ids[start - 1] == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert ids[start + 6] == tokenizer.convert_tokens_to_ids("<|vision_end|>")
    text = tokenizer.decode(ids)
    assert "<|im_start|>user\n<image_clue_0><|vision_start|>" in text
    assert "<|vision_end|></image_clue_0>\n\n" in text
    assert "1280 pixels wide and 960 pixels high" in text
    assert "`image_clue_0`" in text and "counting up from 1" in text
    assert "Question: What colour is the square?\nOptions:\n(A) red\n(B) blue\n" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<code>\n```python\n...\n```\n</code>" in text
    assert "<answer>\n\\boxed{your answer}\n</answer>" in text


def test_video_prompt_describes_the_video_without_showing_it(tokenizer):
    task = Task(id="v", question="How many red objects appear?", answer="2",
                answer_type="numeric", data_source="t", video_path="/v.mp4")
    ids = ChatRenderer(tokenizer).prompt_ids(
        video_prompt_messages(task, VideoInfo(width=192, height=144, num_frames=32, fps=8.0)))
    text = tokenizer.decode(ids)
    assert PAD not in ids and tokenizer.convert_tokens_to_ids("<|video_pad|>") not in ids
    assert "`video_clue_0`" in text and "32 frames of 192x144 pixels at 8.00 frames per second" in text
    assert "counting up from 0" in text
    assert "Question: How many red objects appear?<|im_end|>" in text


def test_observation_renders_as_a_user_turn_with_the_next_assistant_header(tokenizer):
    renderer = ChatRenderer(tokenizer)
    ids = renderer.observation_ids(observation_content("42", []))
    assert ids == enc(tokenizer, "<|im_start|>user\n<tool_response>\n<interpreter>\n"
                                 "Text Result:\n42\nImage Result:\n</interpreter>\n\n"
                                 "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    ids = renderer.observation_ids(observation_content("", [3, 4]), [[1, 2, 4], [1, 2, 2]])
    assert tokenizer.decode(ids) == (
        "<|im_start|>user\n<tool_response>\n<interpreter>\nText Result:\n\nImage Result:\n"
        "<image_clue_3><|vision_start|><|image_pad|><|image_pad|><|vision_end|></image_clue_3>"
        "<image_clue_4><|vision_start|><|image_pad|><|vision_end|></image_clue_4>"
        "</interpreter>\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert renderer.turn_closing_ids == enc(tokenizer, "<|im_end|>\n")


def test_image_count_must_match_the_grids(tokenizer):
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="2 grids given for <\\|image_pad\\|> but the text has 1"):
        renderer.observation_ids(observation_content("", [1]), [[1, 2, 2], [1, 2, 2]])


def test_format_question_without_options_is_the_question(image_task):
    task = Task(id="n", question="How many?", answer="3", answer_type="numeric",
                data_source="t", image_path="/x.png")
    assert format_question(task) == "How many?"
    assert format_question(image_task).endswith("Answer with the letter of the correct option.")
