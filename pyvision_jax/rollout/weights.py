"""New weights from the trainer to the engines.

In process (the trainer and the engine share a process): the trainer hands the params pytree
to the engine's `update_weights(weights, version)` directly, or through a `WeightsInbox` that a
background rollout thread polls between batches; nothing touches the disk.

Across processes (a rollout fleet): the trainer's `WeightsPublisher` writes each version as a
Hugging Face safetensors directory (`save_hf`) under one shared directory and announces it
through the trajectory queue (`queue.publish_weights(version, path)`); each worker's
`WeightsWatcher` compares the announcement with its engine's version between groups and loads
the new version (`load_hf`). Layout of the shared directory:

    <dir>/v000012/             a complete version: config.json, *.safetensors, COMPLETE
    <dir>/.v000013.partial-*/  a version being written (or left by a crashed writer)

A version is written into a hidden staging directory, its `COMPLETE` marker (the version and
the size of every file) is written last, and the staging directory is then renamed to
`v{version:06d}` in one atomic rename. Readers only consider directories with that name whose
marker matches the files on disk, so a writer killed at any point leaves nothing loadable, and
a concurrent reader never sees a version before it is whole. Pruning keeps the newest `keep`
versions; it renames a version away before deleting it, and a reader that loses a race with
pruning gets an `IncompleteWeightsError` (never partial data) and retries with a newer one.
One publisher per directory (the trainer); any number of readers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Iterator

from safetensors import safe_open

from pyvision_jax.agent.engine import Engine
from pyvision_jax.convert import load_hf, save_hf
from pyvision_jax.rollout.queue import TrajectoryQueue, checked_version

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")


class IncompleteWeightsError(RuntimeError):
    """A weights directory is not a complete published version (missing, partial or pruned)."""


@dataclasses.dataclass(frozen=True)
class WeightsVersion:
    """A complete published version and its directory."""

    version: int
    path: Path


def version_dir_name(version: int) -> str:
    """`v000012` for version 12."""
    return f"v{checked_version(version, 'weights version'):06d}"


def update_engines(engines: Iterable[Engine], weights: Any, version: int) -> None:
    """In-process publishing: every engine takes the params pytree (no copy to disk)."""
    version = checked_version(version, "weights version")
    for engine in engines:
        engine.update_weights(weights, version)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_complete_marker(directory: Path, version: int) -> None:
    """Writes `directory`'s COMPLETE marker (the version and every file's size), fsynced:
    the last write of a version, after which readers accept it."""
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
        json.dump({"version": version, "files": files}, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(temporary, directory / COMPLETE_MARKER)
    _fsync_dir(directory)


def check_complete(path: str | os.PathLike) -> int:
    """The version of the complete published directory `path`, else IncompleteWeightsError.

    Complete means: named `v{version:06d}`, a `COMPLETE` marker for that version, and every
    file the marker lists present with the listed size.
    """
    path = Path(path)
    match = _VERSION_DIR.match(path.name)
    if match is None:
        raise IncompleteWeightsError(f"{path}: not a published weights directory (v000012 form)")
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
        version, files = int(marker["version"]), dict(marker["files"])
    except FileNotFoundError:
        raise IncompleteWeightsError(
            f"{path}: no {COMPLETE_MARKER} marker (partial or pruned)") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise IncompleteWeightsError(
            f"{path}/{COMPLETE_MARKER}: unreadable marker: {error}") from None
    if version != int(match.group(1)):
        raise IncompleteWeightsError(f"{path}: marker says version {version}")
    for name, size in files.items():
        try:
            actual = (path / name).stat().st_size
        except FileNotFoundError:
            raise IncompleteWeightsError(
                f"{path}: {name} listed in {COMPLETE_MARKER} is missing") from None
        if actual != size:
            raise IncompleteWeightsError(f"{path}: {name} has {actual} bytes, marker says {size}")
    return version


def complete_versions(directory: str | os.PathLike) -> list[WeightsVersion]:
    """Every complete version under `directory`, oldest first (empty if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        if not _VERSION_DIR.match(entry.name):
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


def load_weights(path: str | os.PathLike, dtype: Any = None) -> tuple[int, Any, Any]:
    """(version, ModelConfig, params) of the complete version at `path`.

    Raises IncompleteWeightsError when `path` is not complete before the load or stopped
    being so during it (pruned), so a caller never gets weights from a partial version.
    """
    version = check_complete(path)
    try:
        config, params = load_hf(path, dtype=dtype, progress=False)
    except OSError as error:
        raise IncompleteWeightsError(f"{path}: vanished while loading: {error}") from error
    check_complete(path)
    return version, config, params


def load_latest(directory: str | os.PathLike, dtype: Any = None,
                attempts: int = 5) -> tuple[int, Any, Any] | None:
    """`load_weights` of the newest complete version under `directory` (None when there is
    none), retrying with the then-newest one when pruning wins a race."""
    for _ in range(attempts):
        latest = latest_complete(directory)
        if latest is None:
            return None
        try:
            return load_weights(latest.path, dtype)
        except IncompleteWeightsError as error:
            logger.info("weights %s went away while loading (%s); retrying", latest.path, error)
    raise IncompleteWeightsError(f"{directory}: no complete version could be loaded in "
                                 f"{attempts} attempts (pruned faster than read?)")


class WeightsPublisher:
    """The trainer's side: versioned, atomic HF safetensors directories, announced on a queue.

    `keep` newest versions stay on disk (at least 2, so readers have time to finish the
    previous one). `extra_files` (tokenizer files, ...) are copied into each version.
    """

    def __init__(self, directory: str | os.PathLike, model_config: Any, *,
                 queue: TrajectoryQueue | None = None, keep: int = 2, dtype: Any = None,
                 extra_files: Sequence[str | os.PathLike] = ()) -> None:
        if not isinstance(keep, int) or keep < 2:
            raise ValueError(f"weights keep must be an integer >= 2, got {keep!r}")
        self.directory = Path(directory).absolute()
        self.model_config = model_config
        self.queue = queue
        self.keep = keep
        self.dtype = dtype
        self.extra_files = tuple(extra_files)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_debris()

    def publish(self, version: int, params: Any) -> Path:
        """Writes `params` as version `version` (skipped when that version is already
        complete, e.g. after a trainer restart), announces it, prunes old versions."""
        version = checked_version(version, "weights version")
        target = self.directory / version_dir_name(version)
        try:
            check_complete(target)
            logger.info("weights version %d already complete at %s", version, target)
        except IncompleteWeightsError:
            if target.exists():  # a version directory without a valid marker: replace it
                self._delete(target)
            staging = self.directory / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
            save_hf(self.model_config, params, staging, dtype=self.dtype,
                    extra_files=self.extra_files, progress=False)
            write_complete_marker(staging, version)
            os.rename(staging, target)
            _fsync_dir(self.directory)
        if self.queue is not None:
            self.queue.publish_weights(version, str(target))
        self.prune()
        return target

    def prune(self) -> list[int]:
        """Deletes all but the newest `keep` complete versions; returns the versions deleted."""
        versions = complete_versions(self.directory)
        old = versions[:-self.keep]
        for item in old:
            self._delete(item.path)
        return [item.version for item in old]

    def _delete(self, path: Path) -> None:
        trash = path.with_name(f".{path.name}.trash-{uuid.uuid4().hex[:8]}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _remove_debris(self) -> None:
        """Staging and trash directories left by a crashed publisher (one publisher per dir)."""
        for entry in self.directory.iterdir():
            if entry.name.startswith(".v") and (".partial-" in entry.name or ".trash-" in entry.name):
                shutil.rmtree(entry, ignore_errors=True)


class WeightsWatcher:
    """A worker's side: loads the announced version into its engine when it changes.

    `poll()` is cheap (one queue read) and is called between groups; it loads only complete
    versions and leaves the engine untouched when the announced one is not (yet) complete.
    """

    def __init__(self, queue: TrajectoryQueue, engine: Engine, *, dtype: Any = None) -> None:
        self.queue = queue
        self.engine = engine
        self.dtype = dtype

    def poll(self) -> int | None:
        """Loads the announced weights if their version differs from the engine's; returns
        the version loaded, or None when nothing was loaded."""
        announced = self.queue.latest_weights()
        if announced is None or announced.version == self.engine.version:
            return None
        try:
            version, _, params = load_weights(announced.location, self.dtype)
        except IncompleteWeightsError as error:
            logger.warning("announced weights version %d not loadable yet: %s",
                           announced.version, error)
            return None
        self.engine.update_weights(params, version)
        logger.info("loaded weights version %d from %s", version, announced.location)
        return version


def open_hf_tensors(path: str | os.PathLike) -> tuple[int, Iterator[tuple[str, Any]]]:
    """(version, (tensor name, torch tensor) pairs) of the complete published version at `path`.

    Every safetensors file is opened (memory-mapped) before the version is checked complete a
    second time, so a version pruned while its tensors stream out still yields all of them.
    """
    version = check_complete(path)
    try:
        handles = [safe_open(str(f), framework="pt") for f in sorted(Path(path).glob("*.safetensors"))]
    except OSError as error:
        raise IncompleteWeightsError(f"{path}: vanished while opening: {error}") from error
    check_complete(path)
    if not handles:
        raise IncompleteWeightsError(f"{path}: no *.safetensors files")
    return version, ((name, handle.get_tensor(name)) for handle in handles for name in handle.keys())


class HfTensorsWatcher(WeightsWatcher):
    """A `WeightsWatcher` for engines that take HF-layout (name, tensor) pairs (vLLM): the
    announced version's safetensors go to `engine.update_weights` as stored, with no Flax
    params in between."""

    def poll(self) -> int | None:
        announced = self.queue.latest_weights()
        if announced is None or announced.version == self.engine.version:
            return None
        try:
            version, tensors = open_hf_tensors(announced.location)
        except IncompleteWeightsError as error:
            logger.warning("announced weights version %d not loadable yet: %s", announced.version, error)
            return None
        self.engine.update_weights(tensors, version)
        logger.info("pushed weights version %d from %s", version, announced.location)
        return version


class WeightsInbox:
    """In-process hand-over to a background rollout thread: the trainer `offer`s params, the
    thread's loop `poll`s between batches and loads the newest offer into its engine, then
    calls `on_loaded(version)` (the queue's version: what staleness is judged against)."""

    def __init__(self, engine: Engine, on_loaded: Callable[[int], None] = lambda version: None) -> None:
        self.engine = engine
        self.on_loaded = on_loaded
        self._lock = threading.Lock()
        self._offer: tuple[Any, int] | None = None

    def offer(self, params: Any, version: int) -> None:
        with self._lock:
            self._offer = (params, checked_version(version, "weights version"))

    def poll(self) -> int | None:
        with self._lock:
            offer, self._offer = self._offer, None
        if offer is None:
            return None
        self.engine.update_weights(*offer)
        self.on_loaded(offer[1])
        return offer[1]
