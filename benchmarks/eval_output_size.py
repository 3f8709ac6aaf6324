"""Bytes an evaluation writes at benchmark scale: 200 tasks x k = 32 rollouts of 1-megapixel
images, in the current layout against the older one, in the same run.

Current: each distinct image once as a PNG file in media/ beside the report, records that
refer to it, report.html showing up to ``--report-rollouts`` rollouts of each task (the
configs' ``eval.report_rollouts_per_task``). Older: every record embedding its task's image
as base64 PNG and report.html showing every rollout with its images inline. Both come from
the evaluator's own writers on the same scored trajectories (``records.trajectory_record``
with and without ``MediaFiles``, ``report.write_page``): the current layout is written to a
temporary directory and its files summed; the older one is counted as it is generated and
never held whole or written. Each rollout is a code turn, its interpreter output and an
answer turn, text of the length the tiny toy's rollouts have; its only image is the task's
(images a rollout's code returns are per rollout in both layouts, each a file of its own in
the current one).

Usage: .venv/bin/python -m benchmarks.eval_output_size [--tasks 200] [--k 32] [--megapixels 1.0]
                                                       [--report-rollouts 4]
Bar: the current layout <= 5 % of the older one and <= 100 MB.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import Image
from tqdm import tqdm

from pyvision_jax.agent.trajectory import ContextImage, EndReason, Trajectory, TurnRecord
from pyvision_jax.data.tasks import Task
from pyvision_jax.eval import metrics
from pyvision_jax.eval.records import (
    RESULTS_FILE,
    TRAJECTORIES_FILE,
    MediaFiles,
    append_jsonl,
    trajectory_record,
    write_json_atomic,
)
from pyvision_jax.eval.report import write_page, write_report
from pyvision_jax.grading.scoring import Score
from pyvision_jax.processing.tokenizer import load_tiny_tokenizer

MAX_FRACTION = 0.05
MAX_BYTES = 100 * 10**6
PATCH = 28  # a merged 2 x 2 unit of 14-pixel patches
PROMPT = (
    "You are an agent that answers questions about an image by writing Python code. "
    "The image is available as image_clue_0. Think step by step, write code in <code> blocks "
    "to crop, zoom or measure, then give the final answer in <answer>\\boxed{}</answer>.\n"
) * 3


class ByteCounter(io.TextIOBase):
    """A text stream that keeps nothing but the number of UTF-8 bytes written to it."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, text: str) -> int:
        self.bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
        return len(text)


def photo_like_png(seed: int, megapixels: float) -> tuple[bytes, int, int]:
    """A PNG of a smooth random scene with sensor-like noise (as large as a photo's PNG)."""
    rng = np.random.default_rng(seed)
    side = int(round((megapixels * 1e6) ** 0.5 / PATCH)) * PATCH
    coarse = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).resize((side, side), Image.BICUBIC)
    pixels = np.asarray(coarse, np.float32) + rng.normal(0.0, 6.0, (side, side, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue(), side, side


def rollout(tokenizer: Any, task: Task, index: int, image: ContextImage) -> Trajectory:
    """A scored-looking rollout: prompt with the image, a code turn, its output, an answer."""

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    prompt = ids(PROMPT + task.question + "\n<|vision_start|>") + [pad] * image.num_tokens + ids("<|vision_end|>")
    code = ids(
        f"Rollout {index}: the object is small, so I crop the region around it and count.\n<code>\n"
        "crop = image_clue_0.crop((120, 340, 480, 700))\nprint(crop.size, count_objects(crop))\n</code>"
    )
    output = ids(f"<interpreter>\nText Result:\n(360, 360) {index % 7}\n</interpreter>\n")
    answer = ids(f"The crop shows {index % 7} objects.\n<answer>\\boxed{{{index % 7}}}</answer>")
    tokens = prompt + code + output + answer
    mask = [0] * len(prompt) + [1] * len(code) + [0] * len(output) + [1] * len(answer)
    ends = np.cumsum([len(prompt), len(code), len(output), len(answer)])
    turns = (
        TurnRecord(int(ends[0]), int(ends[1]), int(ends[2]), "stop", "code", 0),
        TurnRecord(int(ends[2]), int(ends[3]), int(ends[3]), "stop", "answer", 0),
    )
    return Trajectory(
        task.id, index, tokens, mask, np.zeros(len(tokens)), len(prompt), (image,), turns, 1, 1,
        EndReason.DONE, False, str(index % 7), 0,
    )  # fmt: skip


def task_records(tokenizer: Any, number: int, k: int, megapixels: float, media: MediaFiles | None) -> list[dict]:
    png, width, height = photo_like_png(number, megapixels)
    grid = (1, height // 14, width // 14)
    image = ContextImage(0, "task", png, grid, grid[1] * grid[2] // 4)
    task = Task(
        f"task-{number}", "How many objects are there?", "3", "numeric", "bench", image_path=f"img/{number}.png"
    )
    return [
        trajectory_record(task, rollout(tokenizer, task, i, image), Score(float(i % 7 == 3), i % 7 == 3, None),
                          tokenizer, None, media=media)
        for i in range(k)
    ]  # fmt: skip


def current_layout(out: Path, tokenizer: Any, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Writes the evaluation directory as the evaluator does; (its bytes, results)."""
    media = MediaFiles(out)
    outcomes = []
    for number in tqdm(range(args.tasks), desc="current layout", unit="task"):
        records = task_records(tokenizer, number, args.k, args.megapixels, media)
        append_jsonl(out / TRAJECTORIES_FILE, records)
        outcomes += [metrics.RolloutOutcome.from_record(r) for r in records]
    results = {"settings": {"k": args.k}, "complete": True, **metrics.summarize(outcomes)}
    write_json_atomic(out / RESULTS_FILE, results)
    write_report(out, args.report_rollouts)
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), results


def older_layout(tokenizer: Any, args: argparse.Namespace, results: dict[str, Any]) -> int:
    """Bytes of the same evaluation with images embedded in every record and every rollout shown."""
    jsonl = ByteCounter()

    def tasks() -> Iterator[list[dict]]:
        for number in tqdm(range(args.tasks), desc="older layout", unit="task"):
            records = task_records(tokenizer, number, args.k, args.megapixels, None)
            for record in records:
                jsonl.write(json.dumps(record) + "\n")
            yield records

    page = ByteCounter()
    write_page(page, results, tasks(), results["per_data_source"], None)
    return jsonl.bytes + page.bytes + len(json.dumps(results, indent=1).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--megapixels", type=float, default=1.0)
    parser.add_argument("--report-rollouts", type=int, default=4, help="rollouts per task in report.html")
    args = parser.parse_args()
    tokenizer = load_tiny_tokenizer()
    with tempfile.TemporaryDirectory(prefix="eval-size-") as tmp:
        current, results = current_layout(Path(tmp), tokenizer, args)
        media_bytes = sum(p.stat().st_size for p in (Path(tmp) / "media").iterdir())
        files = {p.name: p.stat().st_size for p in Path(tmp).iterdir() if p.is_file()}
    older = older_layout(tokenizer, args, results)
    png, side, _ = photo_like_png(0, args.megapixels)
    print(
        f"{args.tasks} tasks x k = {args.k}, {side}x{side} images ({len(png) / 1e6:.2f} MB PNG; "
        f"{media_bytes / args.tasks / 1e6:.3f} MB a task in media/)"
    )
    print(f"older layout (images in every record, every rollout in the report): {older / 1e6:,.1f} MB")
    print(
        f"current layout: {current / 1e6:,.1f} MB (media/ {media_bytes / 1e6:.1f} MB, "
        + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sorted(files.items()))
        + ")"
    )
    fraction = current / older
    ok = fraction <= MAX_FRACTION and current <= MAX_BYTES
    print(
        f"current / older = {fraction:.2%} (bar: <= {MAX_FRACTION:.0%} and <= {MAX_BYTES / 1e6:.0f} MB): "
        f"{'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
