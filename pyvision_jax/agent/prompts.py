"""Prompts and observations, rendered to token ids with the model's own chat template.

The first prompt of a task comes from a template file with named placeholders
(``agent.templates``; the project's own in ``configs/prompts/``, selected by
``episode.image_prompt_file`` / ``episode.video_prompt_file``). Image tasks put the image in
the context at the template's ``{image}`` slot (the templates wrap it in
``<image_clue_0>``...``</image_clue_0>``) with its size in the text, and in the runtime as
``image_clue_0``. Video tasks put the video ONLY in the runtime as ``video_clue_0``; the text
gives frame width, height, frame count and fps, and the model builds its visual context by
showing the frames it wants.

Images are rendered by the chat template as one ``<|image_pad|>`` each; ``ChatRenderer``
then expands each pad to the image's visual-token count in token space
(``processing.chat.expand_vision_pads``), so the ids are exactly what the engine continues and
nothing is ever decoded and re-encoded.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from typing import Any, Sequence

import numpy as np

from pyvision_jax.agent.templates import PROMPTS_DIR, PromptTemplate, load_template
from pyvision_jax.data.tasks import Task, VideoInfo
from pyvision_jax.processing.chat import VisionTokenIds, expand_vision_pads

IMAGE_NAMES = ("image", "width", "height", "question")
"""Placeholders of an image prompt: the image slot, the original image's size, the question."""
VIDEO_NAMES = ("num_frames", "width", "height", "fps", "duration", "question")
"""Placeholders of a video prompt; fps with 2 decimals, duration (seconds) with 1."""
IMAGE_SLOT = "\u2063IMAGE\u2063"


@dataclasses.dataclass(frozen=True)
class PromptTemplates:
    """The first-prompt templates of image and video tasks."""

    image: PromptTemplate
    video: PromptTemplate

    @classmethod
    def from_files(cls, image_file: str = "", video_file: str = "") -> "PromptTemplates":
        """From template files ("": the project's ``configs/prompts/image.txt`` / ``video.txt``)."""
        return cls(
            load_template(image_file or PROMPTS_DIR / "image.txt", IMAGE_NAMES, ("image", "question")),
            load_template(video_file or PROMPTS_DIR / "video.txt", VIDEO_NAMES, ("question",)),
        )


@functools.cache
def default_prompt_templates() -> PromptTemplates:
    """The project's templates, read once."""
    return PromptTemplates.from_files()


def format_question(task: Task) -> str:
    """The question text with lettered options for multiple-choice tasks."""
    if not task.options:
        return task.question
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines = [f"({letters[i]}) {option}" for i, option in enumerate(task.options)]
    return task.question + "\nOptions:\n" + "\n".join(lines) + "\nAnswer with the letter of the correct option."


def image_prompt_messages(
    task: Task, width: int, height: int, template: PromptTemplate | None = None
) -> list[dict[str, Any]]:
    """The chat messages of an image task; ``width``/``height`` are the original image's."""
    template = template or default_prompt_templates().image
    text = template.render(
        {"image": IMAGE_SLOT, "width": str(width), "height": str(height), "question": format_question(task)}
    )
    before, after = text.split(IMAGE_SLOT, 1)
    parts = [{"type": "text", "text": before}, {"type": "image"}, {"type": "text", "text": after}]
    return [{"role": "user", "content": [p for p in parts if p.get("text") != ""]}]


def video_prompt_messages(task: Task, info: VideoInfo, template: PromptTemplate | None = None) -> list[dict[str, Any]]:
    """The chat messages of a video task (the video itself stays in the runtime)."""
    template = template or default_prompt_templates().video
    text = template.render(
        {
            "num_frames": str(info.num_frames),
            "width": str(info.width),
            "height": str(info.height),
            "fps": f"{info.fps:.2f}",
            "duration": f"{info.num_frames / max(info.fps, 1e-6):.1f}",
            "question": format_question(task),
        }
    )
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


OBSERVATION_FORMATS = ("full", "released")


def observation_content(
    text_result: str, image_labels: Sequence[int], observation_format: str = "full"
) -> list[dict[str, Any]]:
    """The user-turn content of one runtime result inside ``<tool_response>\\n`` ...
    ``\\n</tool_response>``. "full" (ours, DESIGN.md's format) always has both sections:
    ``<interpreter>\\nText Result:\\n{text}\\nImage Result:\\n<image_clue_k>{image}</image_clue_k>...``
    ``</interpreter>\\n``. "released" (the released tool's default branch): a text-only result
    is ``<interpreter>\\nText Result:\\n{text}</interpreter>\\n``; a result with images is
    ``<interpreter>Text Result:\\n{text}\\nImage Result:\\n`` (no newline after the tag), the
    images, then ``</interpreter>\\n``."""
    if observation_format not in OBSERVATION_FORMATS:
        raise ValueError(f"observation format must be one of {OBSERVATION_FORMATS}, got {observation_format!r}")
    if observation_format == "full":
        head = f"<interpreter>\nText Result:\n{text_result}\nImage Result:\n"
    else:
        head = (
            f"<interpreter>Text Result:\n{text_result}\nImage Result:\n"
            if image_labels
            else f"<interpreter>\nText Result:\n{text_result}"
        )
    content: list[dict[str, Any]] = [{"type": "text", "text": "<tool_response>\n" + head}]
    for label in image_labels:
        content += [
            {"type": "text", "text": f"<image_clue_{label}>"},
            {"type": "image"},
            {"type": "text", "text": f"</image_clue_{label}>"},
        ]
    content.append({"type": "text", "text": "</interpreter>\n\n</tool_response>"})
    return content


TEXT_RESULT = re.compile(r"Text Result:\n(.*?)(?:\nImage Result:|</interpreter>)", re.DOTALL)
"""What the code printed, in an observation of either format (group 1)."""


class ChatRenderer:
    """Renders prompts, turn endings and observations to token ids with a tokenizer's chat
    template. Thread-safe (tokenizer calls are serialized)."""

    _SENTINEL = "\u2063SENTINEL\u2063"

    def __init__(self, tokenizer: Any, merge_size: int = 2):
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._merge_size = merge_size
        self.vision_ids = VisionTokenIds.from_tokenizer(tokenizer)
        with self._lock:
            self._turn_closing_ids = self._encode(self._turn_closing_text())
            self._newline_ids = self._encode("\n")
            self._history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            self._history_text = self._render(self._history, add_generation_prompt=False)

    @property
    def turn_closing_ids(self) -> list[int]:
        """Tokens the template puts after an assistant message's content (e.g. <|im_end|>\\n)."""
        return list(self._turn_closing_ids)

    @property
    def newline_ids(self) -> list[int]:
        """The tokens of "\\n" (the released rollout's turn boundary after ``</code>``)."""
        return list(self._newline_ids)

    def prompt_ids(
        self, messages: list[dict[str, Any]], image_grid_thw: Sequence[Sequence[int]] | np.ndarray = ()
    ) -> list[int]:
        """The first prompt, ending with the assistant turn header; the k-th image's pad is
        expanded to the token count of the k-th (t, h, w) grid."""
        with self._lock:
            ids = self._encode(self._render(messages, add_generation_prompt=True))
        return self._expand(ids, image_grid_thw)

    def observation_ids(
        self, content: list[dict[str, Any]], image_grid_thw: Sequence[Sequence[int]] | np.ndarray = ()
    ) -> list[int]:
        """A user turn holding ``content`` followed by the next assistant turn header."""
        with self._lock:
            full = self._render(self._history + [{"role": "user", "content": content}], add_generation_prompt=True)
            if not full.startswith(self._history_text):
                raise ValueError("the chat template does not render conversations incrementally")
            ids = self._encode(full[len(self._history_text) :])
        return self._expand(ids, image_grid_thw)

    def decode(self, token_ids: Sequence[int]) -> str:
        with self._lock:
            return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _expand(self, ids: list[int], grids: Sequence[Sequence[int]] | np.ndarray) -> list[int]:
        grids = np.asarray(grids, np.int64).reshape(-1, 3)
        return expand_vision_pads(ids, self.vision_ids, grids, merge_size=self._merge_size)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _turn_closing_text(self) -> str:
        text = self._render(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": self._SENTINEL}],
            add_generation_prompt=False,
        )
        return text[text.index(self._SENTINEL) + len(self._SENTINEL) :]
