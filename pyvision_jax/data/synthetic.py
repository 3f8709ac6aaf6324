"""Deterministic synthetic tasks (no downloads): images or mp4 videos plus a JSONL task file.

- visual search: a large canvas with many large distractor shapes and one small target;
  multiple-choice questions about the target's colour, shape or position (quadrant);
- counting: shapes scattered without overlap; "how many <colour> <shape>s" (numeric);
- video: short mp4 clips of coloured discs crossing the frame one after another; "how many
  <colour> objects appear" (numeric) or "which colour appears first" (multiple choice);
- shapes: one object, "which object is it" (`data.shape_tasks`: the mode-selection toy);
  shapes_cluttered: the same with a speck on some easy images, where measuring misleads;
  shapes_direct: fewer hard tasks and more specks, so that answering directly pays on average;
  shapes_adaptive: half the tasks hard and more specks still, so that only choosing the plan by
  family pays.

Every file depends only on (seed, kind, index): each task draws from its own
``numpy.random.default_rng([seed, kind, index])``. Videos are H.264 (yuv420p) written by the
ffmpeg binary shipped in the ``imageio-ffmpeg`` wheel, in bit-exact mode, and are read back
by decord.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from pyvision_jax.data.drawing import BACKGROUND, COLOURS, SHAPES, draw_shape
from pyvision_jax.data.shape_tasks import (
    generate_adaptive_shapes,
    generate_cluttered_shapes,
    generate_direct_shapes,
    generate_shapes,
)
from pyvision_jax.data.tasks import Task, load_tasks, write_tasks_jsonl

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
_KIND_CODES = {"visual_search": 1, "counting": 2, "video": 3}
_LETTERS = "ABCD"


def _rng(seed: int, kind: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _KIND_CODES[kind], index])


def _choice(rng: np.random.Generator, items: list | tuple, exclude: tuple = ()) -> str:
    pool = [x for x in items if x not in exclude]
    return pool[int(rng.integers(len(pool)))]


def _multiple_choice(rng: np.random.Generator, correct: str, pool: list | tuple) -> tuple[tuple[str, ...], str]:
    """Four options containing ``correct`` in random order, and the correct letter."""
    others = [x for x in pool if x != correct]
    picks = [others[int(i)] for i in rng.permutation(len(others))[:3]] + [correct]
    options = tuple(picks[int(i)] for i in rng.permutation(len(picks)))
    return options, _LETTERS[options.index(correct)]


def _place(
    rng: np.random.Generator,
    size: float,
    width: int,
    height: int,
    taken: list[tuple[float, float, float]],
    margin: float = 4.0,
    attempts: int = 200,
) -> tuple[float, float] | None:
    """A centre for a shape of ``size`` that overlaps nothing in ``taken``."""
    for _ in range(attempts):
        cx = rng.uniform(size / 2 + margin, width - size / 2 - margin)
        cy = rng.uniform(size / 2 + margin, height - size / 2 - margin)
        if all(math.hypot(cx - x, cy - y) > (size + s) / 2 * 1.15 + margin for x, y, s in taken):
            taken.append((cx, cy, size))
            return cx, cy
    return None


def _visual_search_task(out_dir: Path, seed: int, index: int, canvas: tuple[int, int], num_distractors: int) -> Task:
    rng = _rng(seed, "visual_search", index)
    width, height = canvas
    image = Image.new("RGB", canvas, BACKGROUND)
    draw = ImageDraw.Draw(image)
    question_kind = ("colour", "shape", "position")[index % 3]
    colour, shape = _choice(rng, list(COLOURS)), _choice(rng, SHAPES)
    taken: list[tuple[float, float, float]] = []
    target_size = float(rng.uniform(14, 20))
    while True:
        cx, cy = _place(rng, target_size, width, height, taken)
        if min(abs(cx - width / 2), abs(cy - height / 2)) > 3 * target_size:
            break
        taken.clear()
    for _ in range(num_distractors):
        size = float(rng.uniform(50, 110))
        where = _place(rng, size, width, height, taken)
        if where is None:
            continue
        if question_kind == "colour":  # the target is the only one of its shape
            d_shape, d_colour = _choice(rng, SHAPES, (shape,)), _choice(rng, list(COLOURS))
        else:  # the target is the only one of its colour
            d_shape, d_colour = _choice(rng, SHAPES), _choice(rng, list(COLOURS), (colour,))
        draw_shape(draw, d_shape, *where, size, COLOURS[d_colour])
    draw_shape(draw, shape, cx, cy, target_size, COLOURS[colour])
    if question_kind == "colour":
        question = f"What colour is the small {shape}?"
        options, answer = _multiple_choice(rng, colour, list(COLOURS))
    elif question_kind == "shape":
        question = f"What shape is the small {colour} object?"
        options, answer = _multiple_choice(rng, shape, SHAPES)
    else:
        quadrant = ("top-" if cy < height / 2 else "bottom-") + ("left" if cx < width / 2 else "right")
        question = f"In which part of the image is the small {colour} {shape}?"
        options, answer = _multiple_choice(rng, quadrant, QUADRANTS)
    path = out_dir / f"visual_search_{index:04d}.png"
    image.save(path)
    return Task(
        id=f"visual_search-{seed}-{index:04d}",
        question=question,
        answer=answer,
        answer_type="multiple_choice",
        data_source="synthetic_visual_search",
        image_path=str(path),
        options=options,
        ability=f"visual_search_{question_kind}",
    )


def _counting_task(out_dir: Path, seed: int, index: int, canvas: tuple[int, int]) -> Task:
    rng = _rng(seed, "counting", index)
    width, height = canvas
    image = Image.new("RGB", canvas, BACKGROUND)
    draw = ImageDraw.Draw(image)
    colour, shape = _choice(rng, list(COLOURS)), _choice(rng, SHAPES)
    count = int(rng.integers(1, 10))
    taken: list[tuple[float, float, float]] = []
    placed = 0
    while placed < count:
        size = float(rng.uniform(28, 48))
        where = _place(rng, size, width, height, taken)
        if where is None:
            raise RuntimeError(f"counting task {index}: canvas {canvas} too small")
        draw_shape(draw, shape, *where, size, COLOURS[colour])
        placed += 1
    for _ in range(int(rng.integers(4, 12))):
        size = float(rng.uniform(28, 48))
        where = _place(rng, size, width, height, taken)
        if where is None:
            break
        if rng.random() < 0.5:  # same colour, other shape
            d_shape, d_colour = _choice(rng, SHAPES, (shape,)), colour
        else:  # same shape, other colour
            d_shape, d_colour = shape, _choice(rng, list(COLOURS), (colour,))
        draw_shape(draw, d_shape, *where, size, COLOURS[d_colour])
    path = out_dir / f"counting_{index:04d}.png"
    image.save(path)
    return Task(
        id=f"counting-{seed}-{index:04d}",
        question=f"How many {colour} {shape}s are there in the image?",
        answer=str(count),
        answer_type="numeric",
        data_source="synthetic_counting",
        image_path=str(path),
        ability="counting",
    )


def write_mp4(path: str | Path, frames: np.ndarray, fps: float) -> None:
    """Writes uint8 frames [T, H, W, 3] (H, W multiples of 16) as bit-exact H.264 mp4."""
    try:
        import imageio_ffmpeg
    except ImportError as err:
        raise ImportError(
            "writing mp4 needs the imageio-ffmpeg package (it ships an ffmpeg "
            "binary): pip install imageio-ffmpeg==0.6.0"
        ) from err

    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [T, H, W, 3] uint8, got {frames.shape}")
    _, height, width, _ = frames.shape
    if height % 16 or width % 16:
        raise ValueError(f"frame size {width}x{height} must be a multiple of 16")
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (width, height),
        fps=fps,
        codec="libx264",
        pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p",
        quality=None,
        macro_block_size=16,
        ffmpeg_log_level="error",
        output_params=[
            "-crf",
            "16",
            "-threads",
            "1",
            "-fflags",
            "+bitexact",
            "-flags:v",
            "+bitexact",
            "-map_metadata",
            "-1",
        ],
    )
    writer.send(None)
    for frame in frames:
        writer.send(frame)
    writer.close()


def _video_task(out_dir: Path, seed: int, index: int, size: tuple[int, int], fps: float, num_frames: int) -> Task:
    rng = _rng(seed, "video", index)
    width, height = size
    colours = list(COLOURS)
    question_colour = _choice(rng, colours)
    num_target = int(rng.integers(1, 4))
    others = [_choice(rng, colours, (question_colour,)) for _ in range(int(rng.integers(1, 4)))]
    objects = [question_colour] * num_target + others
    objects = [objects[int(i)] for i in rng.permutation(len(objects))]
    # Entry frames strictly increasing, the first well separated from the second.
    gap = max(2, (num_frames - 10) // len(objects))
    entries = [2 + k * gap + int(rng.integers(0, max(1, gap // 2))) for k in range(len(objects))]
    duration = max(6, num_frames // 3)
    radius = max(6, height // 10)
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    tracks = []
    for entry in entries:
        y0, y1 = rng.uniform(radius + 2, height - radius - 2, size=2)
        x0, x1 = (radius + 2, width - radius - 2) if rng.random() < 0.5 else (width - radius - 2, radius + 2)
        tracks.append((entry, min(num_frames, entry + duration), x0, x1, y0, y1))
    for t in range(num_frames):
        image = Image.new("RGB", size, BACKGROUND)
        draw = ImageDraw.Draw(image)
        for colour, (start, stop, x0, x1, y0, y1) in zip(objects, tracks):
            if start <= t < stop:
                a = (t - start) / max(1, stop - start - 1)
                draw_shape(draw, "circle", x0 + a * (x1 - x0), y0 + a * (y1 - y0), 2 * radius, COLOURS[colour])
        frames[t] = np.asarray(image)
    path = out_dir / f"video_{index:04d}.mp4"
    write_mp4(path, frames, fps)
    if index % 2 == 0:
        return Task(
            id=f"video-{seed}-{index:04d}",
            question=f"How many {question_colour} objects appear in the video?",
            answer=str(num_target),
            answer_type="numeric",
            data_source="synthetic_video_count",
            video_path=str(path),
            ability="video_counting",
        )
    options, answer = _multiple_choice(rng, objects[0], colours)
    return Task(
        id=f"video-{seed}-{index:04d}",
        question="What colour is the first object to appear in the video?",
        answer=answer,
        answer_type="multiple_choice",
        data_source="synthetic_video_order",
        video_path=str(path),
        options=options,
        ability="video_order",
    )


def _generate(
    kind: str, out_dir: str | Path, num_tasks: int, progress: bool, make: Callable[[Path, int], Task]
) -> Path:
    out_dir = Path(out_dir)
    media_dir = out_dir / kind
    media_dir.mkdir(parents=True, exist_ok=True)
    tasks = [make(media_dir, i) for i in tqdm(range(num_tasks), desc=kind, disable=not progress)]
    jsonl = out_dir / f"{kind}.jsonl"
    write_tasks_jsonl(jsonl, tasks)
    return jsonl


def generate_visual_search(
    out_dir: str | Path,
    num_tasks: int,
    seed: int,
    *,
    canvas_size: tuple[int, int] = (1280, 960),
    num_distractors: int = 40,
    progress: bool = False,
) -> Path:
    """Writes ``num_tasks`` visual-search images and ``visual_search.jsonl``; returns its path."""
    return _generate(
        "visual_search",
        out_dir,
        num_tasks,
        progress,
        lambda d, i: _visual_search_task(d, seed, i, canvas_size, num_distractors),
    )


def generate_counting(
    out_dir: str | Path, num_tasks: int, seed: int, *, canvas_size: tuple[int, int] = (640, 480), progress: bool = False
) -> Path:
    """Writes ``num_tasks`` counting images and ``counting.jsonl``; returns its path."""
    return _generate("counting", out_dir, num_tasks, progress, lambda d, i: _counting_task(d, seed, i, canvas_size))


def generate_videos(
    out_dir: str | Path,
    num_tasks: int,
    seed: int,
    *,
    frame_size: tuple[int, int] = (192, 144),
    fps: float = 8.0,
    num_frames: int = 32,
    progress: bool = False,
) -> Path:
    """Writes ``num_tasks`` mp4 clips and ``video.jsonl`` (even indices count, odd indices
    ask which colour came first); returns its path."""
    return _generate(
        "video", out_dir, num_tasks, progress, lambda d, i: _video_task(d, seed, i, frame_size, fps, num_frames)
    )


GENERATORS: dict[str, Callable[..., Path]] = {
    "visual_search": generate_visual_search,
    "counting": generate_counting,
    "video": generate_videos,
    "shapes": generate_shapes,
    "shapes_cluttered": generate_cluttered_shapes,
    "shapes_direct": generate_direct_shapes,
    "shapes_adaptive": generate_adaptive_shapes,
}
DEFAULT_KINDS = ("visual_search", "counting", "video")


def generate_synthetic_suite(
    out_dir: str | Path,
    num_per_kind: int,
    seed: int,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    progress: bool = False,
) -> dict[str, Path]:
    """The chosen kinds under ``out_dir``; returns {kind: jsonl path}."""
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a tuple of kind names, got the string {kinds!r}")
    unknown = [k for k in kinds if k not in GENERATORS]
    if unknown:
        raise ValueError(f"unknown synthetic task kinds {unknown}; expected {list(GENERATORS)}")
    return {kind: GENERATORS[kind](out_dir, num_per_kind, seed, progress=progress) for kind in kinds}


ALL_TASKS_FILE = "tasks.jsonl"


def write_synthetic_task_file(
    out_dir: str | Path,
    num_per_kind: int,
    seed: int,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    progress: bool = False,
) -> Path:
    """`generate_synthetic_suite` plus ``out_dir/tasks.jsonl`` holding every task of every
    kind (what `launch/eval.py --data` takes); returns that file."""
    files = generate_synthetic_suite(out_dir, num_per_kind, seed, kinds, progress=progress)
    path = Path(out_dir) / ALL_TASKS_FILE
    write_tasks_jsonl(path, [task for file in files.values() for task in load_tasks(file).tasks])
    return path
