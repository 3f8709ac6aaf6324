"""The released PyVision SFT schema: loading and writing rows, unchanged.

A row is ``{"conversations": [{"role", "content"}, ...], "images": [paths], "source_dataset"}``.
Contents are strings; every image in a turn is a ``<image>`` placeholder (the first user turn
of an image task begins with ``<image_clue_0><image></image_clue_0>``, tool results are user
turns holding ``<image_clue_k><image></image_clue_k>``); ``images`` lists one path per
placeholder in order of appearance, relative to the file. Errors name the file, the row
(1-based line for JSONL, 0-based index for JSON) and the field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

IMAGE_PLACEHOLDER = "<image>"
ROLES = ("system", "user", "assistant")


class SftFormatError(ValueError):
    """An SFT row is malformed or names a missing image."""


@dataclasses.dataclass(frozen=True)
class SftMessage:
    role: str
    content: str


@dataclasses.dataclass(frozen=True)
class SftRow:
    """One conversation; `image_paths` are absolute; `where` names its file and row."""

    messages: tuple[SftMessage, ...]
    image_paths: tuple[str, ...]
    source_dataset: str
    where: str

    def to_json_row(self, root: str | Path) -> dict[str, Any]:
        """The row in the released schema, image paths relative to `root`."""
        return {
            "conversations": [{"role": m.role, "content": m.content} for m in self.messages],
            "images": [str(Path(p).relative_to(root)) for p in self.image_paths],
            "source_dataset": self.source_dataset,
        }


def _rows(path: Path) -> list[tuple[str, Any]]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        out = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    out.append((f"line {number}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise SftFormatError(f"{path}: line {number}: invalid JSON ({err.msg})") from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SftFormatError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, list):
        raise SftFormatError(f"{path}: a .json SFT file holds a list of rows, got {type(data).__name__}")
    return [(f"row {i}", row) for i, row in enumerate(data)]


def _message(item: Any, where: str, index: int) -> SftMessage:
    field = f"conversations[{index}]"
    if not isinstance(item, dict) or not isinstance(item.get("content"), str):
        raise SftFormatError(f"{where}: field {field}: expected {{'role': ..., 'content': str}}, got {item!r:.120}")
    role = item.get("role")
    if role not in ROLES:
        raise SftFormatError(f"{where}: field {field}.role: unknown role {role!r}; expected one of {ROLES}")
    return SftMessage(role, item["content"])


def parse_row(row: Any, root: Path, where: str, check_images: bool = True) -> SftRow:
    """One row of the released schema (see the module docstring); `where` names it in errors."""
    if not isinstance(row, dict):
        raise SftFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    conversations = row.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        raise SftFormatError(f"{where}: field conversations: expected a non-empty list of messages")
    messages = tuple(_message(item, where, i) for i, item in enumerate(conversations))
    images = row.get("images", [])
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise SftFormatError(f"{where}: field images: expected a list of paths, got {images!r:.120}")
    placeholders = sum(m.content.count(IMAGE_PLACEHOLDER) for m in messages)
    if placeholders != len(images):
        raise SftFormatError(
            f"{where}: field images: {len(images)} images for {placeholders} "
            f"{IMAGE_PLACEHOLDER} placeholders in conversations"
        )
    paths = tuple(str((root / p).resolve()) for p in images)
    for i, path in enumerate(paths):
        if check_images and not Path(path).is_file():
            raise SftFormatError(f"{where}: field images[{i}]: image file {images[i]!r} not found ({path})")
    source = row.get("source_dataset", "")
    if not isinstance(source, str):
        raise SftFormatError(f"{where}: field source_dataset: expected a string, got {source!r:.80}")
    return SftRow(messages, paths, source, where)


def load_sft_rows(path: str | Path, check_images: bool = True) -> list[SftRow]:
    """Every row of a released-schema .json (a list) or .jsonl file."""
    path = Path(path)
    if not path.is_file():
        raise SftFormatError(f"SFT file {path} not found")
    root = path.resolve().parent
    return [parse_row(row, root, f"{path}: {where}", check_images) for where, row in _rows(path)]


def write_sft_rows(path: str | Path, rows: Sequence[SftRow]) -> None:
    """Writes rows as JSONL in the released schema, image paths relative to the file."""
    path = Path(path)
    root = path.resolve().parent
    with open(path, "w") as out:
        for row in rows:
            out.write(json.dumps(row.to_json_row(root)) + "\n")
