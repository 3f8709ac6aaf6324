"""Prompts and observations, rendered to token ids with the model's own chat template.

Image tasks put the image in the context as ``<image_clue_0>``<image>``</image_clue_0>`` (with
its width and height in the text) and in the runtime as ``image_clue_0``. Video tasks put the
video ONLY in the runtime as ``video_clue_0``; the text gives frame width, height, frame count
and fps, and the model builds its visual context by showing the frames it wants.

Images are rendered by the chat template as one ``<|image_pad|>`` each; ``ChatRenderer``
then expands each pad to the image's visual-token count in token space
(``processing.chat.expand_vision_pads``), so the ids are exactly what the engine continues and
nothing is ever decoded and re-encoded.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from pyvision_jax.data.tasks import Task, VideoInfo
from pyvision_jax.processing.chat import VisionTokenIds, expand_vision_pads

_PROTOCOL = """\
To work on the question, you can run Python code in a persistent runtime (variables survive \
between turns; numpy, PIL, matplotlib and decord are available). Take one step per reply:

- Think briefly, then either run code with exactly this block:
<code>
```python
...
```
</code>
  What the code prints comes back as text. Every figure you display with `plt.show()` comes \
back to you as a new image labelled <image_clue_N>, with N counting up from {next_label}, and \
is also stored in the runtime as the variable `image_clue_N` (a PIL image).
- Or, once you are confident, give the final answer and stop:
<answer>
\\boxed{{your answer}}
</answer>

Zoom in, crop, enhance or measure whatever helps; check details before answering."""

_IMAGE_INTRO = """\
You answer questions about images by thinking and writing Python code.

The image above is <image_clue_0>, {width} pixels wide and {height} pixels high. The runtime \
already holds it at full resolution as `image_clue_0` (a PIL RGB image)."""

_VIDEO_INTRO = """\
You answer questions about videos by thinking and writing Python code.

The video is not shown to you. The runtime holds it as `video_clue_0`, a \
`decord.VideoReader` with {num_frames} frames of {width}x{height} pixels at {fps:.2f} frames per \
second ({duration:.1f} seconds). Read the frames you need (for example \
`video_clue_0[i].asnumpy()` or `video_clue_0.get_batch(indices).asnumpy()`) and look at them \
with `plt.show()`."""


def format_question(task: Task) -> str:
    """The question text with lettered options for multiple-choice tasks."""
    if not task.options:
        return task.question
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines = [f"({letters[i]}) {option}" for i, option in enumerate(task.options)]
    return (task.question + "\nOptions:\n" + "\n".join(lines)
            + "\nAnswer with the letter of the correct option.")


def image_prompt_messages(task: Task, width: int, height: int) -> list[dict[str, Any]]:
    """The chat messages of an image task; ``width``/``height`` are the original image's."""
    text = "\n\n".join([
        _IMAGE_INTRO.format(width=width, height=height),
        _PROTOCOL.format(next_label=1),
        "Question: " + format_question(task),
    ])
    return [{"role": "user", "content": [
        {"type": "text", "text": "<image_clue_0>"},
        {"type": "image"},
        {"type": "text", "text": "</image_clue_0>\n\n" + text},
    ]}]


def video_prompt_messages(task: Task, info: VideoInfo) -> list[dict[str, Any]]:
    """The chat messages of a video task (the video itself stays in the runtime)."""
    text = "\n\n".join([
        _VIDEO_INTRO.format(num_frames=info.num_frames, width=info.width, height=info.height,
                            fps=info.fps, duration=info.num_frames / max(info.fps, 1e-6)),
        _PROTOCOL.format(next_label=0),
        "Question: " + format_question(task),
    ])
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def observation_content(text_result: str, image_labels: Sequence[int]) -> list[dict[str, Any]]:
    """The user-turn content of one runtime result, in DESIGN.md's exact format:
    ``<tool_response>\\n<interpreter>\\nText Result:\\n{text}\\nImage Result:\\n``
    ``<image_clue_k>{image}</image_clue_k>...</interpreter>\\n\\n</tool_response>``."""
    content: list[dict[str, Any]] = [{"type": "text", "text": (
        f"<tool_response>\n<interpreter>\nText Result:\n{text_result}\nImage Result:\n")}]
    for label in image_labels:
        content += [{"type": "text", "text": f"<image_clue_{label}>"}, {"type": "image"},
                    {"type": "text", "text": f"</image_clue_{label}>"}]
    content.append({"type": "text", "text": "</interpreter>\n\n</tool_response>"})
    return content


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
            self._history = [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": "y"}]
            self._history_text = self._render(self._history, add_generation_prompt=False)

    @property
    def turn_closing_ids(self) -> list[int]:
        """Tokens the template puts after an assistant message's content (e.g. <|im_end|>\\n)."""
        return list(self._turn_closing_ids)

    def prompt_ids(self, messages: list[dict[str, Any]],
                   image_grid_thw: Sequence[Sequence[int]] | np.ndarray = ()) -> list[int]:
        """The first prompt, ending with the assistant turn header; the k-th image's pad is
        expanded to the token count of the k-th (t, h, w) grid."""
        with self._lock:
            ids = self._encode(self._render(messages, add_generation_prompt=True))
        return self._expand(ids, image_grid_thw)

    def observation_ids(self, content: list[dict[str, Any]],
                        image_grid_thw: Sequence[Sequence[int]] | np.ndarray = ()) -> list[int]:
        """A user turn holding ``content`` followed by the next assistant turn header."""
        with self._lock:
            full = self._render(self._history + [{"role": "user", "content": content}],
                                add_generation_prompt=True)
            if not full.startswith(self._history_text):
                raise ValueError("the chat template does not render conversations incrementally")
            ids = self._encode(full[len(self._history_text):])
        return self._expand(ids, image_grid_thw)

    def decode(self, token_ids: Sequence[int]) -> str:
        with self._lock:
            return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _expand(self, ids: list[int], grids: Sequence[Sequence[int]] | np.ndarray) -> list[int]:
        grids = np.asarray(grids, np.int64).reshape(-1, 3)
        return expand_vision_pads(ids, self.vision_ids, grids, merge_size=self._merge_size)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _turn_closing_text(self) -> str:
        text = self._render([{"role": "user", "content": "x"},
                             {"role": "assistant", "content": self._SENTINEL}],
                            add_generation_prompt=False)
        return text[text.index(self._SENTINEL) + len(self._SENTINEL):]
