"""Synthetic packed text rows shaped like the trainer's (`train.batching.pack_batch` output):
trajectories as segments 1..K of a row, right padding, loss on each trajectory's generated
tail, one advantage per segment."""

from __future__ import annotations

import numpy as np

from pyvision_jax.models import ModelConfig
from pyvision_jax.train.step import TrainBatch

SEGMENT_SHARES = (0.40, 0.25, 0.20, 0.10)
"""Each row holds four trajectories of these fractions of its length; the last 5 % is padding."""
GENERATED_SHARE = 0.6
"""The generated (loss-carrying) tail of each trajectory; the rest is its prompt."""


def segment_lengths(length: int) -> list[int]:
    """Token counts of the segments of one row of `length` tokens."""
    return [max(1, int(share * length)) for share in SEGMENT_SHARES]


def segment_ids(length: int) -> np.ndarray:
    """[T] segment id of each token of a row (0: padding)."""
    ids = np.zeros(length, np.int32)
    start = 0
    for k, n in enumerate(segment_lengths(length)):
        ids[start : start + n] = k + 1
        start += n
    return ids


def packed_text_batch(config: ModelConfig, rows: int, length: int, seed: int = 0) -> TrainBatch:
    """One micro-batch of `rows` packed rows of `length` tokens, as numpy arrays."""
    rng = np.random.default_rng(seed)
    ids = np.full((rows, length), config.pad_token_id or 0, np.int32)
    positions = np.ones((3, rows, length), np.int32)
    loss_mask = np.zeros((rows, length), bool)
    segments = np.broadcast_to(segment_ids(length), (rows, length)).copy()
    for r in range(rows):
        start = 0
        for n in segment_lengths(length):
            ids[r, start : start + n] = rng.integers(0, config.vision_start_token_id, n)
            positions[:, r, start : start + n] = np.arange(n)
            loss_mask[r, start + n - int(GENERATED_SHARE * n) : start + n] = True
            start += n
    advantages = np.tile(np.array([1.0, -1.0, 0.5, -0.5], np.float32), (rows, 1))
    behaviour = np.where(loss_mask, -2.0, 0.0).astype(np.float32)
    return TrainBatch(
        input_ids=ids[None],
        attention_mask=(segments > 0)[None],
        positions=positions[None],
        loss_mask=loss_mask[None],
        behaviour_logprobs=behaviour[None],
        advantages=advantages[None],
        segment_ids=segments[None],
    )
