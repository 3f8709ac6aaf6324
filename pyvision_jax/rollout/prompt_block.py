"""Host-side inputs of one prefill block: prompts (or the rest of prompts a held slot already
holds the start of) left-padded to a length bucket in a batch of a prefill size, with the
images among those tokens, and the M-RoPE positions the rest of a prompt has in the whole
prompt."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyvision_jax.agent.engine import GenerationRequest
from pyvision_jax.models import ModelConfig
from pyvision_jax.models.rope_index import PADDING_POSITION, rope_index_for
from pyvision_jax.rollout.slot_cache import smallest_bucket


def prompt_block(
    config: ModelConfig,
    prompts: Sequence[Sequence[int]],
    pixel_values: Sequence[np.ndarray | None],
    grids: Sequence[np.ndarray],
    length_buckets: Sequence[int],
    batch_sizes: Sequence[int],
) -> tuple[dict, int, int]:
    """(processor-style inputs, batch, length): the prompts left-padded into [batch, length]
    and the patches and grids of the images they hold (pixel_values[i] None: no image)."""
    length = smallest_bucket(max(map(len, prompts)), length_buckets)
    batch = smallest_bucket(len(prompts), batch_sizes)
    ids = np.full((batch, length), config.pad_token_id, np.int32)
    mask = np.zeros((batch, length), bool)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt) :] = prompt
        mask[row, length - len(prompt) :] = True
    inputs = {"input_ids": ids, "attention_mask": mask}
    with_images = [i for i, pixels in enumerate(pixel_values) if pixels is not None]
    if with_images:
        inputs["pixel_values"] = np.concatenate([pixel_values[i] for i in with_images])
        inputs["image_grid_thw"] = np.concatenate([grids[i] for i in with_images])
    return inputs, batch, length


def suffix_positions(
    config: ModelConfig, requests: Sequence[GenerationRequest], starts: Sequence[int], batch: int, length: int
) -> tuple[np.ndarray, list[int]]:
    """Positions [3, batch, length] of each prompt's tokens from starts[i] on, left-padded as
    ``prompt_block`` lays them out, exactly as a prefill of the whole prompt places them
    (images included), and the position of each request's first generated token."""
    positions = np.full((3, batch, length), PADDING_POSITION, np.int32)
    first_generated = []
    for row, (request, start) in enumerate(zip(requests, starts)):
        prompt = np.asarray(request.prompt_token_ids)[None]
        full, delta = rope_index_for(config, prompt, None, request.image_grid_thw)
        positions[:, row, length - prompt.shape[1] + start :] = full[:, 0, start:]
        first_generated.append(prompt.shape[1] + int(delta[0]))
    return positions, first_generated
