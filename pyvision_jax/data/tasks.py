"""Tasks: the schema, JSON/JSONL loaders and media checks.

Rows follow the official PyVision-RL simple schema ``{id, question, answer, ability,
data_source, image_path | video_path}``, optionally with ``answer_type`` and ``options``.
When ``answer_type`` is absent it is inferred: ``multiple_choice`` when options are given,
``numeric`` when the answer parses as a number, ``text`` otherwise. Relative media paths are
resolved against the directory of the file. Every error names the file, the row (1-based line
for JSONL, 0-based index for JSON) and the field.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from PIL import Image

AnswerType = Literal["multiple_choice", "numeric", "text"]
ANSWER_TYPES = ("multiple_choice", "numeric", "text")


class TaskFormatError(ValueError):
    """A task file row is malformed or its media are missing or unreadable."""


@dataclass(frozen=True)
class Task:
    """One question about one image or one video."""

    id: str
    question: str
    answer: str
    answer_type: AnswerType
    data_source: str
    image_path: str | None = None
    video_path: str | None = None
    options: tuple[str, ...] = ()
    ability: str = ""

    def __post_init__(self) -> None:
        if (self.image_path is None) == (self.video_path is None):
            raise ValueError(f"task {self.id}: exactly one of image_path and video_path")
        if self.answer_type not in ANSWER_TYPES:
            raise ValueError(f"task {self.id}: unknown answer_type {self.answer_type!r}")

    @property
    def is_video(self) -> bool:
        return self.video_path is not None

    def to_row(self) -> dict[str, Any]:
        """The JSON row for this task (the loader's input format)."""
        row = {k: v for k, v in asdict(self).items() if v is not None}
        row["options"] = list(self.options)
        return row


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    num_frames: int
    fps: float


@dataclass(frozen=True)
class SkippedRow:
    row: int
    reason: str


@dataclass(frozen=True)
class LoadedTasks:
    """The tasks of one file and the rows skipped under ``skip_bad_rows``."""

    path: Path
    tasks: tuple[Task, ...]
    skipped: tuple[SkippedRow, ...]

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


def read_video_info(path: str | Path, *, decode_all: bool = False) -> VideoInfo:
    """Frame size, frame count and fps of a video, read with decord (raises on failure).

    With `decode_all` every frame is decoded in order, so a file with corrupt packets in
    the middle fails here, at validation, and never inside an episode."""
    import decord

    reader = decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=1)
    num_frames = len(reader)
    if num_frames == 0:
        raise ValueError("the video has no frames")
    height, width = reader[0].shape[:2]
    if decode_all:
        reader.seek(0)
        for _ in range(num_frames):
            reader.next()
    return VideoInfo(width=int(width), height=int(height), num_frames=num_frames, fps=float(reader.get_avg_fps()))


def load_tasks(
    path: str | Path, *, skip_bad_rows: bool = False, check_media: bool = True, extra_fields: tuple[str, ...] = ()
) -> LoadedTasks:
    """Loads a ``.json`` (a list of rows) or ``.jsonl`` (a row per line) task file.

    With ``skip_bad_rows`` malformed rows and rows with missing or corrupt media are counted
    in ``skipped`` instead of raising ``TaskFormatError``. A field that is neither one of
    ``ROW_FIELDS`` nor listed in ``extra_fields`` (accepted and ignored) is an error, so a
    misspelled field never goes unnoticed. A file without rows is an error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    rows = _read_rows(path)
    if not rows:
        raise TaskFormatError(f"{path}: the task file has no rows")
    tasks, skipped, seen_ids = [], [], set()
    for row_number, row in rows:
        try:
            bad_field = _non_utf8_field(row)
            if bad_field is not None:
                raise _FieldError(bad_field[0], f"not valid UTF-8 (byte 0x{bad_field[1]:02x}); save the file as UTF-8")
            task = _task_from_row(row, path.parent, frozenset(ROW_FIELDS) | frozenset(extra_fields))
            if task.id in seen_ids:
                raise _FieldError("id", f"duplicate id {task.id!r}")
            if check_media:
                _check_media(task)
        except _FieldError as err:
            message = f"{path}: row {row_number}: field {err.field!r}: {err.message}"
            if not skip_bad_rows:
                raise TaskFormatError(message) from None
            skipped.append(SkippedRow(row_number, message))
            continue
        seen_ids.add(task.id)
        tasks.append(task)
    return LoadedTasks(path, tuple(tasks), tuple(skipped))


def write_tasks_jsonl(path: str | Path, tasks: list[Task] | tuple[Task, ...]) -> None:
    """Writes tasks as JSONL with media paths relative to the file when they are inside its
    directory."""
    path = Path(path)
    root = path.parent.resolve()
    with path.open("w") as f:
        for task in tasks:
            row = task.to_row()
            for key in ("image_path", "video_path"):
                if key in row and Path(row[key]).resolve().is_relative_to(root):
                    row[key] = str(Path(row[key]).resolve().relative_to(root))
            f.write(json.dumps(row) + "\n")


ROW_FIELDS = (
    "id",
    "question",
    "answer",
    "answer_type",
    "data_source",
    "image_path",
    "video_path",
    "options",
    "ability",
)


class _FieldError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def _read_rows(path: Path) -> list[tuple[int, Any]]:
    # Bytes that are not UTF-8 survive decoding as lone surrogates, so that the row and the
    # field holding them can be named (`_non_utf8_field`) instead of failing the whole file.
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    if path.suffix == ".jsonl":
        rows = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((line_number, json.loads(line)))
            except json.JSONDecodeError as err:
                rows.append((line_number, _InvalidJson(str(err))))
        return rows
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TaskFormatError(f"{path}: not valid JSON: {err}") from None
        if not isinstance(data, list):
            raise TaskFormatError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        return list(enumerate(data))
    raise TaskFormatError(f"{path}: unknown task file type {path.suffix!r} (.json or .jsonl)")


def _non_utf8_field(row: Any, field: str = "(row)") -> tuple[str, int] | None:
    """(field, first bad byte) of the first string of `row` holding bytes that were not
    UTF-8 (decoded as lone surrogates), or None."""
    if isinstance(row, str):
        for char in row:
            if 0xDC80 <= ord(char) <= 0xDCFF:
                return field, ord(char) - 0xDC00
        return None
    items = row.items() if isinstance(row, dict) else enumerate(row) if isinstance(row, list) else ()
    for key, value in items:
        key_problem = _non_utf8_field(key, field) if isinstance(key, str) else None
        found = key_problem or _non_utf8_field(value, key if isinstance(row, dict) and field == "(row)" else field)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class _InvalidJson:
    error: str


def _required_str(row: dict, field: str) -> str:
    if field not in row:
        raise _FieldError(field, "missing")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _FieldError(field, f"expected a string, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise _FieldError(field, "empty")
    return text


def _infer_answer_type(answer: str, options: tuple[str, ...]) -> AnswerType:
    if options:
        return "multiple_choice"
    try:
        return "numeric" if math.isfinite(float(answer.replace(",", ""))) else "text"
    except ValueError:
        return "text"


def _check_fields(row: dict, known: frozenset[str]) -> None:
    for field in sorted(set(row) - known):
        close = difflib.get_close_matches(field, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else " (list it in data.extra_fields to accept it)"
        raise _FieldError(field, f"unknown field{hint}")


def _task_from_row(row: Any, root: Path, known: frozenset[str]) -> Task:
    if isinstance(row, _InvalidJson):
        raise _FieldError("<row>", f"not valid JSON: {row.error}")
    if not isinstance(row, dict):
        raise _FieldError("<row>", f"expected an object, got {type(row).__name__}")
    _check_fields(row, known)
    task_id = _required_str(row, "id")
    question = _required_str(row, "question")
    answer = _required_str(row, "answer")
    data_source = str(row.get("data_source") or "unknown")
    options = row.get("options") or ()
    if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
        raise _FieldError("options", "expected a list of strings")
    options = tuple(options)
    answer_type = row.get("answer_type") or _infer_answer_type(answer, options)
    if answer_type not in ANSWER_TYPES:
        raise _FieldError("answer_type", f"{answer_type!r} is not one of {ANSWER_TYPES}")
    media = {key: row.get(key) for key in ("image_path", "video_path") if row.get(key)}
    if len(media) != 1:
        raise _FieldError(
            "image_path", f"exactly one of image_path and video_path is required (found {sorted(media) or 'neither'})"
        )
    ((media_key, media_value),) = media.items()
    if not isinstance(media_value, str):
        raise _FieldError(media_key, f"expected a path string, got {type(media_value).__name__}")
    media_path = Path(media_value)
    if not media_path.is_absolute():
        media_path = root / media_path
    return Task(
        id=task_id,
        question=question,
        answer=answer,
        answer_type=answer_type,
        data_source=data_source,
        options=options,
        ability=str(row.get("ability") or ""),
        **{media_key: str(media_path)},
    )


def _check_media(task: Task) -> None:
    field = "video_path" if task.is_video else "image_path"
    path = Path(task.video_path or task.image_path)
    if not path.is_file():
        raise _FieldError(field, f"file not found: {path}")
    try:
        if task.is_video:
            read_video_info(path, decode_all=True)
        else:
            with Image.open(path) as image:
                image.verify()
    except Exception as err:  # decoders raise many types; all mean "unreadable"
        kind = "video" if task.is_video else "image"
        raise _FieldError(field, f"cannot decode {kind} {path}: {err}") from None
