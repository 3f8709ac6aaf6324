"""The on-disk format of published weights: versioned directories made complete by a marker.

A version holds the trainable groups only, in the publisher's dtype (bf16); the frozen groups
(the vision tower) are written once per publisher, at its first publish, into their own
directory that every later version's marker names. Layout of the shared directory:

    <dir>/frozen-v000000/      the frozen tower: frozen.safetensors, COMPLETE
    <dir>/v000012/             a complete version: config.json, trainable.safetensors, COMPLETE
                               (naming frozen-v000000)
    <dir>/.v000013.partial-*/  a version being written (or left by a crashed writer)

A version is written into a hidden staging directory, its `COMPLETE` marker (the version and
the size of every file) is written last, and the staging directory is then renamed to
`v{version:06d}` in one atomic rename. Readers only consider directories with that name whose
marker matches the files on disk, so a writer killed at any point leaves nothing loadable, and
a concurrent reader never sees a version before it is whole. A reader that loses a race with
pruning gets an `IncompleteWeightsError` (never partial data) and retries with a newer one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from pyvision_jax.rollout.queue import checked_version

COMPLETE_MARKER = "COMPLETE"
TRAINABLE_FILE, FROZEN_FILE = "trainable.safetensors", "frozen.safetensors"
VERSION_DIR = re.compile(r"^v(\d{6,})$")
FROZEN_DIR = re.compile(r"^frozen-v(\d{6,})$")


class IncompleteWeightsError(RuntimeError):
    """A weights directory is not a complete published version (missing, partial or pruned)."""


@dataclasses.dataclass(frozen=True)
class WeightsVersion:
    """A complete published version and its directory."""

    version: int
    path: Path


@dataclasses.dataclass(frozen=True)
class FrozenPart:
    """The frozen groups a published version refers to: their directory's name (None when
    the version holds every group) and top-level group names."""

    name: str | None
    groups: tuple[str, ...]


def version_dir_name(version: int) -> str:
    """`v000012` for version 12."""
    return f"v{checked_version(version, 'weights version'):06d}"


def fsync_dir(path: Path) -> None:
    """Makes the entries of directory `path` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_complete_marker(directory: Path, version: int, **fields: Any) -> None:
    """Writes `directory`'s COMPLETE marker (the version, every file's size and `fields`),
    fsynced: the last write of a version, after which readers accept it."""
    files = {
        entry.name: entry.stat().st_size
        for entry in sorted(directory.iterdir(), key=lambda e: e.name)
        if entry.is_file()
    }
    for name in files:
        with open(directory / name, "rb") as handle:
            os.fsync(handle.fileno())
    temporary = directory / f".{COMPLETE_MARKER}.tmp"
    with open(temporary, "w") as handle:
        json.dump({"version": version, "files": files, **fields}, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(temporary, directory / COMPLETE_MARKER)
    fsync_dir(directory)


def _checked_marker(path: Path, pattern: re.Pattern) -> dict[str, Any]:
    """The marker of the complete directory `path` (named by `pattern`, its files present
    with the sizes listed), else IncompleteWeightsError."""
    match = pattern.match(path.name)
    if match is None:
        raise IncompleteWeightsError(f"{path}: not a published weights directory (v000012 form)")
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
        version, files = int(marker["version"]), dict(marker["files"])
    except FileNotFoundError:
        raise IncompleteWeightsError(f"{path}: no {COMPLETE_MARKER} marker (partial or pruned)") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise IncompleteWeightsError(f"{path}/{COMPLETE_MARKER}: unreadable marker: {error}") from None
    if version != int(match.group(1)):
        raise IncompleteWeightsError(f"{path}: marker says version {version}")
    for name, size in files.items():
        try:
            actual = (path / name).stat().st_size
        except FileNotFoundError:
            raise IncompleteWeightsError(f"{path}: {name} listed in {COMPLETE_MARKER} is missing") from None
        if actual != size:
            raise IncompleteWeightsError(f"{path}: {name} has {actual} bytes, marker says {size}")
    return marker


def check_complete(path: str | os.PathLike) -> int:
    """The version of the complete published directory `path`, else IncompleteWeightsError.

    Complete means: named `v{version:06d}`, a `COMPLETE` marker for that version, every file
    the marker lists present with the listed size, and the same of the frozen directory the
    marker names (if any).
    """
    path = Path(path)
    marker = _checked_marker(path, VERSION_DIR)
    if marker.get("frozen"):
        _checked_marker(path.parent / marker["frozen"], FROZEN_DIR)
    return int(marker["version"])


def frozen_part(path: str | os.PathLike) -> FrozenPart:
    """What the complete version at `path` takes from its frozen directory."""
    marker = _checked_marker(Path(path), VERSION_DIR)
    return FrozenPart(marker.get("frozen"), tuple(marker.get("frozen_groups", ())))


def published_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of the version at `path`: its own, then its frozen tower's."""
    path = Path(path)
    frozen = frozen_part(path)
    own = sorted(path.glob("*.safetensors"))
    return own + (sorted((path.parent / frozen.name).glob("*.safetensors")) if frozen.name else [])


def complete_versions(directory: str | os.PathLike) -> list[WeightsVersion]:
    """Every complete version under `directory`, oldest first (empty if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        if not VERSION_DIR.match(entry.name):
            continue
        try:
            found.append(WeightsVersion(check_complete(entry), entry))
        except IncompleteWeightsError:
            continue
    return sorted(found, key=lambda item: item.version)


def latest_complete(directory: str | os.PathLike) -> WeightsVersion | None:
    """The newest complete version under `directory`, or None."""
    versions = complete_versions(directory)
    return versions[-1] if versions else None
