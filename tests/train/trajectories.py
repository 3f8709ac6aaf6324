"""Hand-built trajectories with images for the trainer tests."""

import io

import numpy as np
from PIL import Image

from pyvision_jax.agent.trajectory import ContextImage, EndReason, Trajectory
from pyvision_jax.models import ModelConfig


def png_image(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def make_trajectory(
    config: ModelConfig, seed: int, prompt: int = 12, generated: int = 20, images: int = 1
) -> Trajectory:
    """prompt text, then `images` 56x56 images (4 merged tokens each), more text, then
    `generated` model tokens with engine logprobs."""
    rng = np.random.default_rng(seed)
    text = lambda n: rng.integers(10, 1900, n).tolist()  # noqa: E731
    ids, records = text(prompt), []
    for k in range(images):
        ids += [config.vision_start_token_id] + [config.image_token_id] * 4 + [config.vision_end_token_id]
        ids += text(3)
        records.append(ContextImage(k, "task", png_image(56, 56, seed * 10 + k), (1, 4, 4), 4))
    prompt_length = len(ids)
    ids += text(generated)
    loss_mask = np.r_[np.zeros(prompt_length), np.ones(generated)].astype(np.int8)
    logprobs = np.where(loss_mask, -rng.uniform(0.5, 8.0, len(ids)), 0.0)
    return Trajectory(
        task_id=f"t{seed}",
        rollout_index=0,
        token_ids=np.asarray(ids),
        loss_mask=loss_mask,
        logprobs=logprobs,
        prompt_length=prompt_length,
        images=tuple(records),
        turns=(),
        num_tool_calls=0,
        num_successful_tool_calls=0,
        end_reason=EndReason.DONE,
        broken=False,
        final_answer=None,
        policy_version=0,
    )
