"""The files of an evaluation directory and the trajectory record they hold.

- ``trajectories.jsonl``: one ``trajectory_record`` a line, the k lines of a task appended
  together (``append_jsonl``); ``finished_tasks`` names the tasks whose k lines are all there
  and ``iter_finished`` streams their records task by task;
- ``media/``: the images of the records, one file per distinct image named by its content
  hash (``MediaFiles``: the PNG itself, or a JPEG preview of a large one), so a task's image
  is stored once however many rollouts show it; a record refers to its images by ``file``
  (records of older evaluations embed them as ``png_base64``, and every reader takes both);
- ``results.json`` and ``settings.json``: written whole and atomically (``write_json_atomic``);
- ``report.html``: the trajectory viewer (``report.write_report``).

Every whole-file write goes through a temporary file renamed over the target, so a crash
leaves the old file or the new one, never a torn one; none holds the whole file in memory.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TextIO

from PIL import Image

from pyvision_jax.agent.parse import parse_action
from pyvision_jax.agent.prompts import TEXT_RESULT
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data.tasks import Task
from pyvision_jax.grading.scoring import Score

TRAJECTORIES_FILE = "trajectories.jsonl"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"
SETTINGS_FILE = "settings.json"
MEDIA_DIR = "media"
PREVIEW_SIDE = 768
"""Images larger than this (either side) are kept in media/ as a JPEG preview of this size."""
JPEG_QUALITY = 85
_IMAGE_PAD = "<|image_pad|>"


class MediaFiles:
    """Image files under ``out_dir/media/``, one per distinct image (named by the SHA-256 of
    its PNG), each written once, atomically: the PNG the model saw when it fits in
    ``preview_side`` pixels, else a JPEG preview of that size (the report shows images at
    most 360 pixels wide; the task row keeps the original's path)."""

    def __init__(self, out_dir: str | os.PathLike, preview_side: int = PREVIEW_SIDE):
        self.directory = Path(out_dir) / MEDIA_DIR
        self.preview_side = preview_side
        self._stored: dict[str, str] = {}

    def store(self, png: bytes) -> str:
        """The path of ``png``'s file relative to the evaluation directory (written if new)."""
        digest = hashlib.sha256(png).hexdigest()[:32]
        if digest in self._stored:
            return self._stored[digest]
        with Image.open(io.BytesIO(png)) as image:  # reads the size only, unless a preview is made
            fits = max(image.size) <= self.preview_side
            name = f"{digest}.{'png' if fits else 'jpg'}"
            path = self.directory / name
            if not path.is_file():
                self.directory.mkdir(parents=True, exist_ok=True)
                with _atomic_file(path, "wb") as f:
                    f.write(png if fits else _jpeg_preview(image, self.preview_side))
        self._stored[digest] = f"{MEDIA_DIR}/{name}"
        return self._stored[digest]


def _jpeg_preview(image: Image.Image, side: int) -> bytes:
    preview = image.convert("RGB")
    preview.thumbnail((side, side), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    preview.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def _image_entry(image: Any, media: MediaFiles | None) -> dict[str, Any]:
    entry = {
        "label": image.label,
        "source": image.source,
        "grid_thw": list(image.grid_thw),
        "num_tokens": image.num_tokens,
    }
    if media is None:
        return entry | {"png_base64": base64.b64encode(image.png).decode("ascii")}
    return entry | {"file": media.store(image.png)}


def _decode_collapsed(tokenizer: Any, ids: Sequence[int], image_pad_id: int) -> str:
    """Decoded text with each run of image-pad tokens shown once as ``<|image_pad|>×N``."""
    pieces, i = [], 0
    while i < len(ids):
        j = i
        pad = ids[i] == image_pad_id
        while j < len(ids) and (ids[j] == image_pad_id) == pad:
            j += 1
        if pad:
            pieces.append(f"{_IMAGE_PAD}×{j - i}")
        else:
            pieces.append(tokenizer.decode(list(ids[i:j]), skip_special_tokens=False))
        i = j
    return "".join(pieces)


def trajectory_record(
    task: Task,
    trajectory: Trajectory,
    score: Score,
    tokenizer: Any,
    uniform_tokens: int | None,
    grading_failed: bool = False,
    media: MediaFiles | None = None,
) -> dict[str, Any]:
    """One line of trajectories.jsonl: the metrics fields of ``metrics.RolloutOutcome``, the
    task row, and a decoded view for people (prompt, per-turn text / code / interpreter
    output, images as files of ``media``; without it, embedded as base64 PNG). Token ids are
    not kept (see the trainer's samples). A rollout whose grading failed (the judge did not
    answer) counts as broken, never wrong."""
    image_pad_id = tokenizer.convert_tokens_to_ids(_IMAGE_PAD)
    ids = trajectory.token_ids.tolist()
    code_images = [im for im in trajectory.images if im.source == "code"]
    turns, next_image = [], 0
    for turn in trajectory.turns:
        text = tokenizer.decode(ids[turn.generated_start : turn.generated_end], skip_special_tokens=False)
        observation = _decode_collapsed(tokenizer, ids[turn.generated_end : turn.observation_end], image_pad_id)
        interpreter = TEXT_RESULT.search(observation)
        labels = [im.label for im in code_images[next_image : next_image + turn.num_new_images]]
        next_image += turn.num_new_images
        turns.append(
            {
                "text": text,
                "action": turn.action,
                "code": parse_action(text).code,
                "observation": observation,
                "interpreter_text": interpreter.group(1) if interpreter else None,
                "image_labels": labels,
                "tool_error": turn.tool_error,
                "finish_reason": turn.finish_reason,
            }
        )
    return {
        "task_id": task.id,
        "data_source": task.data_source,
        "rollout_index": trajectory.rollout_index,
        "score": float(score.score),
        "correct": bool(score.correct),
        "extracted": score.extracted,
        "num_tool_calls": trajectory.num_tool_calls,
        "num_successful_tool_calls": trajectory.num_successful_tool_calls,
        "end_reason": trajectory.end_reason.value,
        "broken": trajectory.broken or grading_failed,
        "grading_failed": grading_failed,
        "visual_tokens": trajectory.num_visual_tokens,
        "response_tokens": trajectory.num_generated_tokens,
        "total_tokens": len(ids),
        "is_video": task.is_video,
        "uniform_video_tokens": uniform_tokens,
        "final_answer": trajectory.final_answer,
        "policy_version": trajectory.policy_version,
        "timings": dict(trajectory.timings),
        "task": task.to_row(),
        "prompt": _decode_collapsed(tokenizer, ids[: trajectory.prompt_length], image_pad_id),
        "turns": turns,
        "images": [_image_entry(im, media) for im in trajectory.images],
    }


@contextlib.contextmanager
def _atomic_file(path: Path, mode: str = "w") -> Iterator[Any]:
    """A temporary file beside ``path``, synced and renamed over it when the block ends
    (removed when it raises)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open(mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_text_file(path: Path) -> contextlib.AbstractContextManager[TextIO]:
    """A text file written piece by piece that replaces ``path`` whole when complete."""
    return _atomic_file(path, "w")


def write_text_atomic(path: Path, text: str) -> None:
    """Writes ``text`` (UTF-8) to a temporary file, syncs it and renames it over ``path``."""
    with atomic_text_file(path) as f:
        f.write(text)


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes JSON to a temporary file and renames it over ``path``."""
    write_text_atomic(path, json.dumps(data, indent=1))


def _jsonl(records: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replaces the lines of ``path`` by ``records`` atomically, writing them one by one."""
    with atomic_text_file(path) as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def append_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Appends ``records`` to ``path`` with one write, synced before returning."""
    with path.open("a") as f:
        f.write(_jsonl(records))
        f.flush()
        os.fsync(f.fileno())


def _keyed_records(path: Path) -> Iterator[tuple[str, int, dict[str, Any]] | None]:
    """(task id, rollout index, record) of each line of ``path``; None for a line that is
    not a record (a torn last line)."""
    with path.open() as f:
        for line in f:
            try:
                record = json.loads(line)
                yield record["task_id"], int(record["rollout_index"]), record
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                yield None


def finished_tasks(path: Path, k: int) -> tuple[list[str], bool]:
    """Ids of the tasks whose k rollouts are all in ``path`` (in file order), and whether the
    file holds anything else (unfinished tasks, a torn last line). Keeps only ids in memory."""
    if not path.is_file():
        return [], False
    indices: dict[str, set[int]] = {}
    dirty = False
    for keyed in _keyed_records(path):
        if keyed is None:
            dirty = True
        else:
            indices.setdefault(keyed[0], set()).add(keyed[1])
    finished = [task_id for task_id, seen in indices.items() if seen == set(range(k))]
    return finished, dirty or len(finished) < len(indices)


def iter_finished(path: Path, k: int) -> Iterator[list[dict[str, Any]]]:
    """The k records of each finished task (rollout order), task by task as their last line
    is read: only the tasks being read are in memory (a task's lines are written together)."""
    waiting = set(finished_tasks(path, k)[0])
    pending: dict[str, dict[int, dict[str, Any]]] = {}
    for keyed in _keyed_records(path) if waiting else ():
        if keyed is None or keyed[0] not in waiting:
            continue
        task_id, index, record = keyed
        records = pending.setdefault(task_id, {})
        records[index] = record
        if len(records) == k:
            yield [records[i] for i in range(k)]
            del pending[task_id]
            waiting.discard(task_id)
