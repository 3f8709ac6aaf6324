"""A run's append-only outputs made consistent with the step it resumes from.

A run that resumes from checkpoint step `s` redoes the steps after `s`: whatever the killed
run wrote for them (TensorBoard events, `trajectories.jsonl` records) is removed first, so
every step appears once. A JSONL line torn by a crash or a full disk (no final newline) is
dropped, so it never merges with the next record. Records are appended whole, with one
`write` and an fsync, so a crash leaves at most one torn line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

EVENTS_PREFIX = "events.out.tfevents."


class OutputWriteError(RuntimeError):
    """A run output could not be written (the message names the path and the cause)."""


def _replace(path: Path, write: Any) -> None:
    temporary = path.with_name(f".{path.name}.rewrite")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def truncate_jsonl(path: str | os.PathLike, last_step: int) -> int:
    """Keeps the records of `path` with "step" <= `last_step` and drops a torn last line;
    returns how many lines were dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().split(b"\n")[:-1] + [b""]:
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if isinstance(record, dict) and int(record.get("step", 0)) > last_step:
            dropped += 1
            continue
        kept.append(line)
    torn = not path.read_bytes().endswith(b"\n") and path.stat().st_size > 0
    if dropped or torn:
        _replace(path, lambda handle: handle.write(b"".join(line + b"\n" for line in kept)))
    return dropped


def append_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Appends `records` as whole lines in one write, fsynced."""
    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    if not data:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise OutputWriteError(f"{path} not written: {error.strerror or error}") from error


def truncate_events(logdir: str | os.PathLike, last_step: int) -> int:
    """Rewrites every TensorBoard event file under `logdir` without the events of steps after
    `last_step` (a torn final record is dropped too); returns how many events were dropped."""
    dropped = 0
    for path in sorted(Path(logdir).glob(f"{EVENTS_PREFIX}*")):
        records = list(RawEventFileLoader(str(path)).Load())
        kept = [record for record in records if event_pb2.Event.FromString(record).step <= last_step]
        if len(kept) != len(records):
            dropped += len(records) - len(kept)
            _replace(path, lambda handle, kept=kept: [RecordWriter(handle).write(record) for record in kept])
    return dropped
