import pytest

from pyvision_jax.agent.prompts import (
    ChatRenderer,
    PromptTemplates,
    default_prompt_templates,
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
    assert "<|vision_end|></image_clue_0>\n\nImage Width: 1280; Image Height: 960\n" in text
    assert "global variable `image_clue_i`" in text and "`image_clue_0`" in text
    assert "Question: What colour is the square?\nOptions:\n(A) red\n(B) blue\n" in text
    assert text.endswith("<answer>\n\\boxed{your answer}\n</answer><|im_end|>\n<|im_start|>assistant\n")
    assert "<code>\n```python\n# your code\n```\n</code>" in text


def test_the_default_templates_carry_the_released_facts_in_the_released_order():
    image = default_prompt_templates().image.text
    facts = [
        "Image Width: {width}; Image Height: {height}",
        "`image_clue_i`",
        "numpy, PIL",
        "Question: {question}",
        "Format reminder",
    ]
    assert [image.index(f) for f in facts] == sorted(image.index(f) for f in facts)
    video = default_prompt_templates().video.text
    facts = [
        "Video Width: {width}; Video Height: {height}",
        "`video_clue_0`",
        "VideoReader()",
        "numpy, PIL",
        "Question: {question}",
        "Format reminder",
    ]
    assert [video.index(f) for f in facts] == sorted(video.index(f) for f in facts)


def test_video_prompt_describes_the_video_without_showing_it(tokenizer):
    task = Task(
        id="v",
        question="How many red objects appear?",
        answer="2",
        answer_type="numeric",
        data_source="t",
        video_path="/v.mp4",
    )
    ids = ChatRenderer(tokenizer).prompt_ids(
        video_prompt_messages(task, VideoInfo(width=192, height=144, num_frames=32, fps=8.0))
    )
    text = tokenizer.decode(ids)
    assert PAD not in ids and tokenizer.convert_tokens_to_ids("<|video_pad|>") not in ids
    assert "`video_clue_0`" in text and "Video Width: 192; Video Height: 144; Frames: 32; FPS: 8.00" in text
    assert "(4.0 seconds)" in text and "counting up from 0" in text
    assert "Question: How many red objects appear?\n" in text


RELEASED_LIKE = (
    "<image_clue_0>{image}</image_clue_0>\nImage Width: {width}; Image Height: {height}\n"
    "Solve it with code in {{curly}} braces, then \\boxed{} the answer: {question}"
)


def test_a_users_own_template_renders_byte_for_byte(tmp_path, tokenizer, image_task):
    path = tmp_path / "mine.txt"
    path.write_text(RELEASED_LIKE + "\n")
    templates = PromptTemplates.from_files(image_file=str(path))
    messages = image_prompt_messages(image_task, 640, 480, templates.image)
    expected_before = "<image_clue_0>"
    expected_after = (
        "</image_clue_0>\nImage Width: 640; Image Height: 480\n"
        "Solve it with code in {{curly}} braces, then \\boxed{} the answer: " + format_question(image_task)
    )
    assert messages[0]["content"] == [
        {"type": "text", "text": expected_before},
        {"type": "image"},
        {"type": "text", "text": expected_after},
    ]
    ids = ChatRenderer(tokenizer).prompt_ids(messages, [[1, 2, 2]])
    assert tokenizer.decode(ids).endswith(
        "user\n<image_clue_0><|vision_start|><|image_pad|><|vision_end|>"
        + expected_after
        + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_without_its_required_placeholders_names_the_file(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("Image Width: {width}\nQuestion: {question}")
    with pytest.raises(ValueError, match=r"bad.txt: placeholders \['\{image\}'\] are missing"):
        PromptTemplates.from_files(image_file=str(path))
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        PromptTemplates.from_files(video_file=str(tmp_path / "nowhere.txt"))


def test_observation_renders_as_a_user_turn_with_the_next_assistant_header(tokenizer):
    renderer = ChatRenderer(tokenizer)
    ids = renderer.observation_ids(observation_content("42", []))
    assert ids == enc(
        tokenizer,
        "<|im_start|>user\n<tool_response>\n<interpreter>\n"
        "Text Result:\n42\nImage Result:\n</interpreter>\n\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    ids = renderer.observation_ids(observation_content("", [3, 4]), [[1, 2, 4], [1, 2, 2]])
    assert tokenizer.decode(ids) == (
        "<|im_start|>user\n<tool_response>\n<interpreter>\nText Result:\n\nImage Result:\n"
        "<image_clue_3><|vision_start|><|image_pad|><|image_pad|><|vision_end|></image_clue_3>"
        "<image_clue_4><|vision_start|><|image_pad|><|vision_end|></image_clue_4>"
        "</interpreter>\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert renderer.turn_closing_ids == enc(tokenizer, "<|im_end|>\n")


def released_observation(text: str, labels: list[int]) -> str:
    """The released tool's default branch, from its description: a text-only result is
    `<interpreter>\\nText Result:\\n{out}</interpreter>`; a result with images opens
    `<interpreter>Text Result:\\n{out}\\nImage Result:\\n`, then each image in its
    `<image_clue_k>` tags; both inside `<tool_response>\\n` ... `\\n\\n</tool_response>`."""
    if not labels:
        return f"<tool_response>\n<interpreter>\nText Result:\n{text}</interpreter>\n\n</tool_response>"
    images = "".join(f"<image_clue_{k}><image></image_clue_{k}>" for k in labels)
    return (
        f"<tool_response>\n<interpreter>Text Result:\n{text}\nImage Result:\n{images}</interpreter>\n\n</tool_response>"
    )


def content_text(content) -> str:
    return "".join(part["text"] if part["type"] == "text" else "<image>" for part in content)


@pytest.mark.parametrize("text", ["", "7", "a\nb", "  padded", "x\n", "<answer>\n\\boxed{A}\n</answer>"])
@pytest.mark.parametrize("labels", [[], [1], [1, 2], [3, 4, 5], [0]])
def test_the_released_observation_format_writes_the_released_text(text, labels):
    assert content_text(observation_content(text, labels, "released")) == released_observation(text, labels)


def test_image_count_must_match_the_grids(tokenizer):
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="2 grids given for <\\|image_pad\\|> but the text has 1"):
        renderer.observation_ids(observation_content("", [1]), [[1, 2, 2], [1, 2, 2]])


def test_format_question_without_options_is_the_question(image_task):
    task = Task(id="n", question="How many?", answer="3", answer_type="numeric", data_source="t", image_path="/x.png")
    assert format_question(task) == "How many?"
    assert format_question(image_task).endswith("Answer with the letter of the correct option.")
