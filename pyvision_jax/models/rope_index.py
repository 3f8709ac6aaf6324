"""Host-side 3-D M-RoPE position ids (temporal, height, width) for Qwen2.5-VL, in numpy.

Text tokens get the same position on all three axes, increasing by one. A run of image or
video placeholder tokens gets a grid of positions: temporal index (scaled by
`second_per_grid_t * tokens_per_second` for videos), row and column of the merged patch,
all offset by the position where the run starts. Text after an image or video continues at
max(previous positions) + 1, the rule of the original Qwen2.5-VL and of vLLM (recent
transformers releases advance by max(h, w) instead, which differs for videos).
"""

from __future__ import annotations

import numpy as np

from pyvision_jax.models.config import ModelConfig

PADDING_POSITION = 1  # what the reference implementation leaves at padded slots


def vision_position_grid(
    start: int,
    grid_thw: tuple[int, int, int],
    spatial_merge_size: int,
    second_per_grid: float,
    tokens_per_second: float,
) -> np.ndarray:
    """[3, t*h*w/merge^2] positions of one image/video's merged tokens, starting at `start`.

    Images pass second_per_grid = 0. The temporal index `k * second_per_grid * tokens_per_second`
    is computed in float32 in that order and truncated, as the reference does with torch tensors.
    """
    t, h, w = (int(x) for x in grid_thw)
    gh, gw = h // spatial_merge_size, w // spatial_merge_size
    temporal = ((np.arange(t, dtype=np.float32) * np.float32(second_per_grid)) * np.float32(tokens_per_second)).astype(
        np.int64
    )
    tt, hh, ww = np.meshgrid(temporal, np.arange(gh), np.arange(gw), indexing="ij")
    return np.stack([tt.ravel(), hh.ravel(), ww.ravel()]).astype(np.int64) + start


def _sequence_positions(
    ids: np.ndarray, queues: dict[int, list], kinds: dict[int, str], merge: int, tokens_per_second: float, where: str
) -> np.ndarray:
    """Positions [3, n] of one unpadded sequence; pops (thw, second_per_grid) from `queues[token]`."""
    out = np.empty((3, len(ids)), dtype=np.int64)
    next_pos, i, n = 0, 0, len(ids)
    is_visual = np.isin(ids, list(queues))
    while i < n:
        if is_visual[i]:
            token = int(ids[i])
            kind = kinds[token]
            if not queues[token]:
                raise ValueError(f"{where}: more <|{kind}_pad|> tokens than {kind}_grid_thw entries")
            thw, second_per_grid = queues[token].pop(0)
            count = int(np.prod(thw)) // merge**2
            if i + count > n or not np.all(ids[i : i + count] == token):
                raise ValueError(
                    f"{where}: the {kind} at token {i} with grid_thw {list(thw)} needs "
                    f"{count} consecutive <|{kind}_pad|> tokens"
                )
            block = vision_position_grid(next_pos, thw, merge, second_per_grid, tokens_per_second)
            out[:, i : i + count] = block
            next_pos = int(block.max()) + 1
            i += count
        else:
            j = i + int(np.argmax(is_visual[i:])) if is_visual[i:].any() else n
            out[:, i:j] = np.arange(next_pos, next_pos + j - i)
            next_pos += j - i
            i = j
    return out


def _grid_list(grid_thw: np.ndarray | None) -> list[tuple[int, int, int]]:
    if grid_thw is None:
        return []
    return [(int(t), int(h), int(w)) for t, h, w in np.asarray(grid_thw).reshape(-1, 3)]


def rope_index(
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    second_per_grid_ts: np.ndarray | None = None,
    *,
    image_token_id: int,
    video_token_id: int,
    spatial_merge_size: int = 2,
    tokens_per_second: float = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """3-D position ids [3, B, T] (int32) and decode deltas [B] (int32).

    Images and videos are matched to placeholder runs in batch-major order, as the processor
    lays them out. Padded slots (attention_mask == 0) get position 1. While decoding, the
    k-th generated token of row b (k counted from the number of real prompt tokens) sits at
    position `n_real_prompt[b] + k + deltas[b]` on all three axes.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids: expected shape [batch, length], got {ids.shape}")
    mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask: shape {mask.shape} differs from input_ids {ids.shape}")
    images, videos = _grid_list(image_grid_thw), _grid_list(video_grid_thw)
    seconds = (
        np.ones(len(videos))
        if second_per_grid_ts is None
        else np.asarray(second_per_grid_ts, dtype=np.float64).reshape(-1)
    )
    if len(seconds) != len(videos):
        raise ValueError(f"second_per_grid_ts: {len(seconds)} entries for {len(videos)} videos")
    queues = {
        image_token_id: [(g, 0.0) for g in images],
        video_token_id: [(g, float(s)) for g, s in zip(videos, seconds)],
    }
    kinds = {image_token_id: "image", video_token_id: "video"}
    positions = np.full((3,) + ids.shape, PADDING_POSITION, dtype=np.int64)
    deltas = np.zeros(ids.shape[0], dtype=np.int64)
    for b in range(ids.shape[0]):
        real = ids[b][mask[b]]
        row = _sequence_positions(
            real, queues, kinds, spatial_merge_size, tokens_per_second, where=f"input_ids row {b}"
        )
        positions[:, b, mask[b]] = row
        deltas[b] = (int(row.max()) + 1 if row.size else 0) - len(real)
    if queues[image_token_id] or queues[video_token_id]:
        raise ValueError(
            f"{len(queues[image_token_id])} image and {len(queues[video_token_id])} video "
            f"grids have no placeholder tokens in input_ids"
        )
    return positions.astype(np.int32), deltas.astype(np.int32)


def rope_index_for(
    config: ModelConfig,
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    second_per_grid_ts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_index` with token ids, merge size and tokens_per_second taken from `config`."""
    return rope_index(
        input_ids,
        attention_mask,
        image_grid_thw,
        video_grid_thw,
        second_per_grid_ts,
        image_token_id=config.image_token_id,
        video_token_id=config.video_token_id,
        spatial_merge_size=config.vision.spatial_merge_size,
        tokens_per_second=config.vision.tokens_per_second,
    )


def decode_position_ids(deltas: np.ndarray, num_real_tokens: np.ndarray, length: int = 1) -> np.ndarray:
    """[3, B, length] positions of the next `length` tokens given the real tokens seen so far."""
    deltas = np.asarray(deltas).reshape(-1, 1)
    start = np.asarray(num_real_tokens).reshape(-1, 1)
    pos = start + deltas + np.arange(length)[None, :]
    return np.broadcast_to(pos[None], (3,) + pos.shape).astype(np.int32)
