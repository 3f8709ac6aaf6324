"""Host-side packing of trajectories into a `TrainBatch` (numpy).

The row length is the smallest length bucket that holds the longest trajectory, so the
train step compiles once per bucket. Without packing each trajectory is one right-padded
row. With packing (`BatchingConfig.pack`) trajectories are placed first-fit-decreasing into
rows of that length, each a segment with its own id (1..K) and its own 3-D M-RoPE positions
(from `rope_index`, per trajectory: text after an image continues at max + 1), so a batch
costs about its real tokens instead of rows x the longest row; the numbers of micro-batches
and of segments per row are rounded up to a few bucket sizes. Rows are split into
micro-batches of `micro_batch` rows; every micro-batch carries its own images (PNG ->
normalized patches, in the order their tokens appear) in a vision window layout padded to
sizes shared by all micro-batches of the batch. A missing row (None) is padding: no
attention, no loss. With `mini_batches` N > 1 the rows form N equal consecutive chunks,
each packed into its own M / N micro-batches (the train step's disjoint mini-batches, one
optimizer update each). With `loss_unit` k > 0 the trajectories of each chunk, in order,
form loss units of k (the released per-device micro-batch of "token-mean-per-micro-batch"),
and every segment carries its unit's loss-token count and share (`rl.losses`).

Every batch of a new shape compiles the train step again (15 s for the small model on CPU,
against 2-4 s for a compiled step), so the sizes that vary from step to step (micro-batches,
segments per row, vision windows and merged tokens) can be held at a `BatchShape` floor: the
GRPO trainer and the SFT loop pass the largest shape they have seen, and the shapes only grow, a few times a run.
With `BatchingConfig.images_per_row` the vision sizes start with room for that many of the
largest images per row, so they need not grow at all.
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
from pyvision_jax.models.vision import (
    VisionLayout,
    bucket_size,
    image_room,
    max_image_tokens,
    vision_layout,
    window_units,
)
from pyvision_jax.processing.image import patchify, rescale_and_normalize
from pyvision_jax.train.step import TrainBatch


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    length_buckets: tuple[int, ...] = (512, 1024)
    micro_batch: int = 4
    """Rows per micro-batch (the batch's rows are padded up to a multiple of it)."""
    pack: bool = False
    """Several trajectories per row (segment ids); config key train.pack."""
    mini_batches: int = 1
    """Disjoint mini-batches (one optimizer update each; `StepConfig.mini_batches`)."""
    loss_unit: int = 0
    """Trajectories per loss unit of "token-mean-per-micro-batch" (rl.loss_micro_batch;
    0: none, the train step's micro-batch is the unit)."""
    images_per_row: int = 0
    """Vision sizes of a micro-batch start with room for this many images of `image_max_pixels`
    per row (train.images_per_row; 0: no floor), so batches within it share one compiled step."""
    image_max_pixels: int = 0

    def __post_init__(self) -> None:
        buckets = tuple(int(b) for b in self.length_buckets)
        if not buckets or any(b < 2 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"train.length_buckets must be increasing lengths >= 2, got {self.length_buckets}")
        if self.micro_batch < 1:
            raise ValueError(f"train.micro_batch must be >= 1, got {self.micro_batch}")
        if self.images_per_row < 0 or self.image_max_pixels < 0:
            raise ValueError(
                f"train.images_per_row ({self.images_per_row}) and episode.image_max_pixels "
                f"({self.image_max_pixels}) must be >= 0"
            )
        if self.mini_batches < 1 or self.loss_unit < 0:
            raise ValueError(
                f"BatchingConfig: mini_batches ({self.mini_batches}) must be >= 1 and "
                f"loss_unit (rl.loss_micro_batch, {self.loss_unit}) >= 0"
            )
        object.__setattr__(self, "length_buckets", buckets)


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """The sizes of a packed batch that vary with its rollouts (besides the row length)."""

    micro_batches: int = 1
    segments: int = 1
    windows: int = 1
    merged: int = 1

    def cover(self, other: "BatchShape") -> "BatchShape":
        """The smallest shape that holds both."""
        return BatchShape(*(max(a, b) for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True)
class BatchStats:
    rows: int
    real_rows: int
    length: int
    real_tokens: int
    loss_tokens: int
    images: int
    shape: BatchShape = BatchShape()


def choose_length(lengths: Sequence[int], buckets: Sequence[int]) -> int:
    """The smallest bucket >= max(lengths); a clear error when none is long enough."""
    longest = max(lengths, default=1)
    for bucket in buckets:
        if bucket >= longest:
            return bucket
    raise ValueError(
        f"a trajectory has {longest} tokens, more than the largest of "
        f"train.length_buckets={list(buckets)}; raise the buckets or lower "
        f"episode.max_total_tokens"
    )


def image_patches(png: bytes, grid_thw: Sequence[int], model_config: ModelConfig) -> np.ndarray:
    """[t*h*w, patch_dim] normalized patches of a context image stored at its context size."""
    vision = model_config.vision
    with Image.open(io.BytesIO(png)) as image:
        pixels = np.asarray(image.convert("RGB"))
    t, h, w = (int(x) for x in grid_thw)
    if pixels.shape[:2] != (h * vision.patch_size, w * vision.patch_size) or t != 1:
        raise ValueError(
            f"context image of {pixels.shape[1]}x{pixels.shape[0]} pixels does not match "
            f"its grid_thw {[t, h, w]} (patch size {vision.patch_size})"
        )
    normalized = rescale_and_normalize(pixels)
    frames = np.broadcast_to(normalized[None], (vision.temporal_patch_size, *normalized.shape))
    patches, _ = patchify(
        np.ascontiguousarray(frames), vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size
    )
    return patches


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: the indices of `lengths` placed in each row, no row over `capacity`."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
        if fits is None:
            rows.append([])
            room.append(capacity)
            fits = len(rows) - 1
        rows[fits].append(index)
        room[fits] -= lengths[index]
    return rows


def pack_batch(
    model_config: ModelConfig,
    rows: Sequence[Trajectory | None],
    advantages: Sequence[float],
    config: BatchingConfig,
    floor: BatchShape = BatchShape(),
) -> tuple[TrainBatch, BatchStats]:
    """A numpy TrainBatch of `rows` (padded to a multiple of `config.micro_batch` rows;
    packed into segments when `config.pack`), no size below `floor`."""
    if len(rows) != len(advantages):
        raise ValueError(f"pack_batch: {len(rows)} rows but {len(advantages)} advantages")
    micro, count = config.micro_batch, config.mini_batches
    if len(rows) % count:
        raise ValueError(f"pack_batch: {len(rows)} rows do not split into {count} equal mini-batches")
    size = len(rows) // count
    chunks = [[i for i in range(j * size, (j + 1) * size) if rows[i] is not None] for j in range(count)]
    real = [i for chunk in chunks for i in chunk]
    length = choose_length([len(rows[i].token_ids) for i in real], config.length_buckets)
    if config.images_per_row and config.image_max_pixels:
        vision = model_config.vision
        tokens = max_image_tokens(vision, config.image_max_pixels)
        windows, merged = image_room(vision, micro * config.images_per_row, tokens)
        floor = floor.cover(BatchShape(windows=windows, merged=merged))
    floor_per_chunk = -(-floor.micro_batches // count)
    if config.pack:
        per_chunk = [
            [[chunk[j] for j in row] for row in pack_rows([len(rows[i].token_ids) for i in chunk], length)]
            for chunk in chunks
        ]
        chunk_micro = bucket_size(max(-(-len(p) // micro) for p in per_chunk), floor_per_chunk)
        segments = bucket_size(max((len(row) for p in per_chunk for row in p), default=1), floor.segments)
    else:
        per_chunk = [
            [[i] if rows[i] is not None else [] for i in range(j * size, (j + 1) * size)] for j in range(count)
        ]
        chunk_micro = max(-(-size // micro), floor_per_chunk)
        segments = 1
    num_micro = chunk_micro * count
    num_rows = num_micro * micro
    placement = [row for p in per_chunk for row in p + [[]] * (chunk_micro * micro - len(p))]
    units = _loss_units(rows, chunks, config.loss_unit)
    pad_id = model_config.pad_token_id if model_config.pad_token_id is not None else 0

    ids = np.full((num_rows, length), pad_id, np.int32)
    attention = np.zeros((num_rows, length), bool)
    loss_mask = np.zeros((num_rows, length), bool)
    behaviour = np.zeros((num_rows, length), np.float32)
    segment_ids = np.zeros((num_rows, length), np.int32)
    positions = np.ones((3, num_rows, length), np.int32)
    row_advantages = np.zeros((num_rows, segments), np.float32)
    row_units = np.zeros((2, num_rows, segments), np.float32)
    for r, members in enumerate(placement):
        start = 0
        for k, index in enumerate(members):
            row = rows[index]
            span = slice(start, start + len(row.token_ids))
            ids[r, span] = row.token_ids
            attention[r, span] = True
            loss_mask[r, span] = row.loss_mask.astype(bool)
            behaviour[r, span] = row.logprobs
            segment_ids[r, span] = k + 1
            row_advantages[r, k] = advantages[index]
            if units:
                row_units[:, r, k] = units[index]
            grid = np.asarray([im.grid_thw for im in row.images], np.int64).reshape(-1, 3)
            positions[:, r, span] = rope_index_for(
                model_config, ids[r : r + 1, span], None, grid if len(grid) else None
            )[0][:, 0]
            start = span.stop

    groups = [
        [rows[i] for members in placement[m * micro : (m + 1) * micro] for i in members] for m in range(num_micro)
    ]
    grids = [np.asarray([im.grid_thw for r in g for im in r.images], np.int64).reshape(-1, 3) for g in groups]
    pixel_values = layout = None
    num_images = sum(len(g) for g in grids)
    windows, merged = 1, 1
    if num_images:
        pixel_values, layout = _vision_arrays(model_config, groups, grids, floor)
        vision = model_config.vision
        windows = layout.patch_index.shape[1] // (window_units(vision) ** 2 * vision.merge_unit)
        merged = layout.merged_index.shape[1]
    per_micro = lambda x: x.reshape(num_micro, micro, *x.shape[1:])  # noqa: E731
    per_row = lambda x: per_micro(x if config.pack else x[:, 0])  # noqa: E731
    batch = TrainBatch(
        input_ids=per_micro(ids),
        attention_mask=per_micro(attention),
        positions=positions.reshape(3, num_micro, micro, length).swapaxes(0, 1),
        loss_mask=per_micro(loss_mask),
        behaviour_logprobs=per_micro(behaviour),
        advantages=per_row(row_advantages),
        pixel_values=pixel_values,
        layout=layout,
        segment_ids=per_micro(segment_ids) if config.pack else None,
        unit_tokens=per_row(row_units[0]) if units else None,
        unit_share=per_row(row_units[1]) if units else None,
    )
    stats = BatchStats(
        rows=num_rows,
        real_rows=len(real),
        length=length,
        real_tokens=int(attention.sum()),
        loss_tokens=int((loss_mask & attention).sum()),
        images=num_images,
        shape=BatchShape(num_micro, segments, windows, merged),
    )
    return batch, stats


def _loss_units(
    rows: Sequence[Trajectory | None], chunks: list[list[int]], unit: int
) -> dict[int, tuple[float, float]]:
    """{row index: (loss tokens of its unit, 1 / the unit's trajectories with loss tokens)}
    for units of `unit` consecutive trajectories within each mini-batch chunk ({} when 0)."""
    out: dict[int, tuple[float, float]] = {}
    for chunk in chunks if unit else ():
        for start in range(0, len(chunk), unit):
            members = chunk[start : start + unit]
            tokens = [int(np.count_nonzero(rows[i].loss_mask)) for i in members]
            share = 1.0 / max(sum(t > 0 for t in tokens), 1)
            out.update((i, (float(sum(tokens)), share)) for i in members)
    return out


def _vision_arrays(
    model_config: ModelConfig, groups: list[list[Trajectory]], grids: list[np.ndarray], floor: BatchShape
) -> tuple[np.ndarray, VisionLayout]:
    """Stacked [M, ...] pixel values and window layouts with sizes shared by all micro-batches
    (and no smaller than `floor`)."""
    vision = model_config.vision
    window_len = window_units(vision) ** 2 * vision.merge_unit
    first = [vision_layout(g, vision) for g in grids]
    min_windows = max([lay.num_slots // window_len for lay in first] + [floor.windows])
    min_merged = max([lay.merged_index.shape[0] for lay in first] + [floor.merged])
    layouts, pixels = [], []
    for group, grid in zip(groups, grids):
        layout = vision_layout(grid, vision, min_windows=min_windows, min_merged=min_merged)
        values = np.zeros((layout.num_slots, vision.patch_dim), np.float32)
        patches = [image_patches(im.png, im.grid_thw, model_config) for row in group for im in row.images]
        if patches:
            flat = np.concatenate(patches)
            values[: flat.shape[0]] = flat
        layouts.append(layout)
        pixels.append(values)
    stacked = VisionLayout(
        **{f.name: np.stack([getattr(lay, f.name) for lay in layouts]) for f in dataclasses.fields(VisionLayout)}
    )
    return np.stack(pixels), stacked
