"""Host-side packing of trajectories into a padded `TrainBatch` (numpy).

Rows are right-padded to the smallest length bucket that holds the longest row, so the
train step compiles once per bucket. Rows are split into micro-batches of `micro_batch`
rows; every micro-batch carries its own images (PNG -> normalized patches) in a vision
window layout padded to sizes shared by all micro-batches of the batch, and its 3-D M-RoPE
positions computed with `rope_index` (text after an image continues at max + 1).
A missing row (None) is padding: one pad token, no attention, no loss.
"""
from __future__ import annotations

import dataclasses
import io
from typing import Sequence

import numpy as np
from PIL import Image

from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.models import ModelConfig
from pyvision_jax.models.rope_index import rope_index_for
from pyvision_jax.models.vision import VisionLayout, vision_layout, window_units
from pyvision_jax.processing.image import patchify, rescale_and_normalize
from pyvision_jax.train.step import TrainBatch


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    length_buckets: tuple[int, ...] = (512, 1024)
    micro_batch: int = 4
    """Rows per micro-batch (the batch's rows are padded up to a multiple of it)."""

    def __post_init__(self) -> None:
        buckets = tuple(int(b) for b in self.length_buckets)
        if not buckets or any(b < 2 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"train.length_buckets must be increasing lengths >= 2, got {self.length_buckets}")
        if self.micro_batch < 1:
            raise ValueError(f"train.micro_batch must be >= 1, got {self.micro_batch}")
        object.__setattr__(self, "length_buckets", buckets)


@dataclasses.dataclass(frozen=True)
class BatchStats:
    rows: int
    real_rows: int
    length: int
    real_tokens: int
    loss_tokens: int
    images: int


def choose_length(lengths: Sequence[int], buckets: Sequence[int]) -> int:
    """The smallest bucket >= max(lengths); a clear error when none is long enough."""
    longest = max(lengths, default=1)
    for bucket in buckets:
        if bucket >= longest:
            return bucket
    raise ValueError(f"a trajectory has {longest} tokens, more than the largest of "
                     f"train.length_buckets={list(buckets)}; raise the buckets or lower "
                     f"episode.max_total_tokens")


def image_patches(png: bytes, grid_thw: Sequence[int], model_config: ModelConfig) -> np.ndarray:
    """[t*h*w, patch_dim] normalized patches of a context image stored at its context size."""
    vision = model_config.vision
    with Image.open(io.BytesIO(png)) as image:
        pixels = np.asarray(image.convert("RGB"))
    t, h, w = (int(x) for x in grid_thw)
    if pixels.shape[:2] != (h * vision.patch_size, w * vision.patch_size) or t != 1:
        raise ValueError(f"context image of {pixels.shape[1]}x{pixels.shape[0]} pixels does not match "
                         f"its grid_thw {[t, h, w]} (patch size {vision.patch_size})")
    normalized = rescale_and_normalize(pixels)
    frames = np.broadcast_to(normalized[None], (vision.temporal_patch_size, *normalized.shape))
    patches, _ = patchify(np.ascontiguousarray(frames), vision.patch_size, vision.spatial_merge_size,
                          vision.temporal_patch_size)
    return patches


def pack_batch(model_config: ModelConfig, rows: Sequence[Trajectory | None], advantages: Sequence[float],
               config: BatchingConfig) -> tuple[TrainBatch, BatchStats]:
    """A numpy TrainBatch of `rows` (padded to a multiple of `config.micro_batch`)."""
    if len(rows) != len(advantages):
        raise ValueError(f"pack_batch: {len(rows)} rows but {len(advantages)} advantages")
    micro = config.micro_batch
    num_rows = max(-(-len(rows) // micro) * micro, micro)
    rows = list(rows) + [None] * (num_rows - len(rows))
    advantages = np.concatenate([np.asarray(advantages, np.float32),
                                 np.zeros(num_rows - len(advantages), np.float32)])
    length = choose_length([len(r.token_ids) for r in rows if r is not None], config.length_buckets)
    pad_id = model_config.pad_token_id if model_config.pad_token_id is not None else 0

    ids = np.full((num_rows, length), pad_id, np.int32)
    attention = np.zeros((num_rows, length), bool)
    loss_mask = np.zeros((num_rows, length), bool)
    behaviour = np.zeros((num_rows, length), np.float32)
    for i, row in enumerate(rows):
        if row is None:
            advantages[i] = 0.0
            continue
        n = len(row.token_ids)
        ids[i, :n] = row.token_ids
        attention[i, :n] = True
        loss_mask[i, :n] = row.loss_mask.astype(bool)
        behaviour[i, :n] = row.logprobs

    num_micro = num_rows // micro
    groups = [rows[m * micro:(m + 1) * micro] for m in range(num_micro)]
    grids = [np.asarray([im.grid_thw for r in g if r is not None for im in r.images], np.int64).reshape(-1, 3)
             for g in groups]
    positions = np.stack([
        rope_index_for(model_config, ids[m * micro:(m + 1) * micro], attention[m * micro:(m + 1) * micro],
                       grids[m] if len(grids[m]) else None)[0]
        for m in range(num_micro)])

    pixel_values = layout = None
    num_images = sum(len(g) for g in grids)
    if num_images:
        pixel_values, layout = _vision_arrays(model_config, groups, grids)
    batch = TrainBatch(
        input_ids=ids.reshape(num_micro, micro, length),
        attention_mask=attention.reshape(num_micro, micro, length),
        positions=positions,
        loss_mask=loss_mask.reshape(num_micro, micro, length),
        behaviour_logprobs=behaviour.reshape(num_micro, micro, length),
        advantages=advantages.reshape(num_micro, micro),
        pixel_values=pixel_values, layout=layout)
    stats = BatchStats(rows=num_rows, real_rows=sum(r is not None for r in rows), length=length,
                       real_tokens=int(attention.sum()), loss_tokens=int((loss_mask & attention).sum()),
                       images=num_images)
    return batch, stats


def _vision_arrays(model_config: ModelConfig, groups: list[list[Trajectory | None]],
                   grids: list[np.ndarray]) -> tuple[np.ndarray, VisionLayout]:
    """Stacked [M, ...] pixel values and window layouts with sizes shared by all micro-batches."""
    vision = model_config.vision
    window_len = window_units(vision) ** 2 * vision.merge_unit
    first = [vision_layout(g, vision) for g in grids]
    min_windows = max(l.num_slots // window_len for l in first)
    min_merged = max(l.merged_index.shape[0] for l in first)
    layouts, pixels = [], []
    for group, grid in zip(groups, grids):
        layout = vision_layout(grid, vision, min_windows=min_windows, min_merged=min_merged)
        values = np.zeros((layout.num_slots, vision.patch_dim), np.float32)
        patches = [image_patches(im.png, im.grid_thw, model_config)
                   for row in group if row is not None for im in row.images]
        if patches:
            flat = np.concatenate(patches)
            values[:flat.shape[0]] = flat
        layouts.append(layout)
        pixels.append(values)
    stacked = VisionLayout(**{f.name: np.stack([getattr(l, f.name) for l in layouts])
                              for f in dataclasses.fields(VisionLayout)})
    return np.stack(pixels), stacked
