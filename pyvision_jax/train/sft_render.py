"""SFT rows -> token ids and loss masks, rendered exactly as the RL episode renders turns.

The pieces are tokenized the way `agent.episode` appends them: the messages up to the first
assistant turn with `ChatRenderer.prompt_ids` (the episode's first prompt); each assistant
content on its own (what an engine generates; loss 1); after an assistant turn that a user
turn follows, the turn boundary (`episode.turn_boundary`: the template's turn closing, or the
released newline) and that user turn with `observation_ids` (the episode's observation; loss
0); the last assistant turn ends with the end-of-turn token
(loss 1: the model learns to stop). Images are resized to their context size by the
episode's own `context_image`. A sample is a `Trajectory`, so the trainer's batching packs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig, context_image
from pyvision_jax.agent.prompts import ChatRenderer
from pyvision_jax.agent.trajectory import ContextImage, EndReason, Trajectory
from pyvision_jax.data.sft_rows import IMAGE_PLACEHOLDER, SftFormatError, SftRow


def content_parts(text: str) -> list[dict[str, Any]]:
    """A string content with `<image>` placeholders as chat-template content parts."""
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _context_images(row: SftRow, config: EpisodeConfig) -> list[ContextImage]:
    images = []
    for i, path in enumerate(row.image_paths):
        try:
            with Image.open(path) as opened:
                images.append(context_image(opened, i, "row", config)[0])
        except (OSError, ValueError) as err:
            raise SftFormatError(f"{row.where}: field images[{i}]: {path}: {err}") from None
    return images


class SftRenderer:
    """Renders rows with a tokenizer's chat template and an episode's image sizing."""

    def __init__(self, tokenizer: Any, config: EpisodeConfig):
        self.tokenizer = tokenizer
        self.config = config
        self.chat = ChatRenderer(tokenizer, merge_size=config.merge_size)

    def _turn_end_ids(self) -> list[int]:
        """What closes an assistant turn before a tool response, as in the episode
        (`episode.turn_boundary`: the template's turn closing, or the released newline)."""
        return self.chat.newline_ids if self.config.turn_boundary == "newline" else self.chat.turn_closing_ids

    def render(self, row: SftRow) -> Trajectory:
        """The sample of `row` (a Trajectory whose loss mask marks the assistant tokens)."""
        messages = row.messages
        first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
        if first is None or first == 0 or messages[-1].role != "assistant":
            raise SftFormatError(
                f"{row.where}: field conversations: needs a prompt, then assistant turns, ending with an assistant turn"
            )
        images = _context_images(row, self.config)
        grids = [im.grid_thw for im in images]
        used = sum(m.content.count(IMAGE_PLACEHOLDER) for m in messages[:first])
        ids = self.chat.prompt_ids(
            [{"role": m.role, "content": content_parts(m.content)} for m in messages[:first]], grids[:used]
        )
        mask = [0] * len(ids)
        for index in range(first, len(messages)):
            message = messages[index]
            expected = "assistant" if (index - first) % 2 == 0 else "user"
            if message.role != expected:
                raise SftFormatError(
                    f"{row.where}: field conversations[{index}].role: expected {expected!r} "
                    f"(assistant and user turns alternate after the prompt), got {message.role!r}"
                )
            if message.role == "assistant":
                piece = list(self.tokenizer.encode(message.content, add_special_tokens=False))
                if index == len(messages) - 1:
                    piece.append(self.chat.turn_closing_ids[0])
                ids += piece
                mask += [1] * len(piece)
            else:
                count = message.content.count(IMAGE_PLACEHOLDER)
                piece = self._turn_end_ids() + self.chat.observation_ids(
                    content_parts(message.content), grids[used : used + count]
                )
                used += count
                ids += piece
                mask += [0] * len(piece)
        return Trajectory(
            task_id=row.where,
            rollout_index=0,
            token_ids=ids,
            loss_mask=mask,
            logprobs=np.zeros(len(ids), np.float32),
            prompt_length=mask.index(1),
            images=tuple(images),
            turns=(),
            num_tool_calls=0,
            num_successful_tool_calls=0,
            end_reason=EndReason.DONE,
            broken=False,
            final_answer=None,
            policy_version=0,
        )
