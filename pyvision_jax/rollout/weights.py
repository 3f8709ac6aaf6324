"""New weights from the trainer to the engines.

In process (the trainer and the engine share a process): the trainer hands the params pytree
to the engine's `update_weights(weights, version)` directly, or through a `WeightsInbox` that a
background rollout thread polls between batches; nothing touches the disk.

Across processes (a rollout fleet): the trainer's `WeightsPublisher` (the shared-filesystem
`rollout.weight_sync.WeightTransport`, run off the training thread by its
`BackgroundPublisher`) writes each version under one shared directory and announces it through
the trajectory queue (`queue.publish_weights(version, path)`); each worker's `WeightsWatcher`
compares the announcement with its engine's version between groups and loads the new version.
A version holds the trainable groups only, in the publisher's dtype (bf16); the frozen groups
(the vision tower) are written once per publisher, at its first publish, into their own
directory that every later version's marker names. Layout of the shared directory:

    <dir>/frozen-v000000/      the frozen tower: frozen.safetensors, COMPLETE
    <dir>/v000012/             a complete version: config.json, trainable.safetensors, COMPLETE
                               (naming frozen-v000000)
    <dir>/.v000013.partial-*/  a version being written (or left by a crashed writer)

Readers cast to their engine's dtype (`dtype=`, fp32 engines); the JAX watcher keeps the
frozen tower it loaded and reads only the trainable file while the marker names the same tower;
vLLM gets every tensor of both files at each reload (its in-place reload expects them all).

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
from pyvision_jax.convert import load_hf, save_tensors
from pyvision_jax.rollout.queue import TrajectoryQueue, checked_version

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
TRAINABLE_FILE, FROZEN_FILE = "trainable.safetensors", "frozen.safetensors"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_FROZEN_DIR = re.compile(r"^frozen-v(\d{6,})$")


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
    _fsync_dir(directory)


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
    marker = _checked_marker(path, _VERSION_DIR)
    if marker.get("frozen"):
        _checked_marker(path.parent / marker["frozen"], _FROZEN_DIR)
    return int(marker["version"])


@dataclasses.dataclass(frozen=True)
class FrozenPart:
    """The frozen groups a published version refers to: their directory's name (None when
    the version holds every group) and top-level group names."""

    name: str | None
    groups: tuple[str, ...]


def frozen_part(path: str | os.PathLike) -> FrozenPart:
    """What the complete version at `path` takes from its frozen directory."""
    marker = _checked_marker(Path(path), _VERSION_DIR)
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


@dataclasses.dataclass(frozen=True)
class FrozenTower:
    """Frozen groups a reader loaded once, reused while versions name the same directory."""

    name: str
    params: dict[str, Any]


def load_weights(path: str | os.PathLike, dtype: Any = None, reuse: FrozenTower | None = None) -> tuple[int, Any, Any]:
    """(version, ModelConfig, params) of the complete version at `path`, its frozen groups
    taken from `reuse` when the version names that tower (else read from its directory).

    Raises IncompleteWeightsError when `path` is not complete before the load or stopped
    being so during it (pruned), so a caller never gets weights from a partial version.
    """
    version = check_complete(path)
    frozen = frozen_part(path)
    reused = reuse is not None and frozen.name == reuse.name
    try:
        config, params = load_hf(
            path,
            dtype=dtype,
            progress=False,
            weight_files=published_files(path),
            include=(lambda leaf: leaf[0] not in frozen.groups) if reused else None,
        )
    except OSError as error:
        raise IncompleteWeightsError(f"{path}: vanished while loading: {error}") from error
    check_complete(path)
    return version, config, {**params, **reuse.params} if reused else params


def load_latest(directory: str | os.PathLike, dtype: Any = None, attempts: int = 5) -> tuple[int, Any, Any] | None:
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
    raise IncompleteWeightsError(
        f"{directory}: no complete version could be loaded in {attempts} attempts (pruned faster than read?)"
    )


class WeightsPublisher:
    """The trainer's side: versioned, atomic directories of the trainable groups in `dtype`,
    the `frozen_groups` once, announced on a queue (the shared-filesystem transport).

    `keep` newest versions stay on disk (at least 2, so readers have time to finish the
    previous one). `extra_files` (tokenizer files, ...) are copied into each version.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        model_config: Any,
        *,
        queue: TrajectoryQueue | None = None,
        keep: int = 2,
        dtype: Any = "bfloat16",
        frozen_groups: Sequence[str] = (),
        extra_files: Sequence[str | os.PathLike] = (),
    ) -> None:
        if not isinstance(keep, int) or keep < 2:
            raise ValueError(f"weights keep must be an integer >= 2, got {keep!r}")
        self.directory = Path(directory).absolute()
        self.model_config = model_config
        self.queue = queue
        self.keep = keep
        self.dtype = dtype
        self.frozen_groups = tuple(frozen_groups)
        self.extra_files = tuple(extra_files)
        self.frozen: str | None = None
        """The frozen directory this publisher's versions name (written at its first publish)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_debris()

    def publish(self, version: int, params: Any) -> Path:
        """Writes `params` as version `version` (skipped when that version is already
        complete, e.g. after a trainer restart), announces it, prunes old versions. The
        frozen groups may be left out of `params` once this publisher has written them."""
        version = checked_version(version, "weights version")
        target = self.directory / version_dir_name(version)
        try:
            check_complete(target)
            self.frozen = self.frozen or frozen_part(target).name
            logger.info("weights version %d already complete at %s", version, target)
        except IncompleteWeightsError:
            if target.exists():  # a version directory without a valid marker: replace it
                self._delete(target)
            frozen = self._frozen_dir(version, params)
            trainable = {group: value for group, value in params.items() if group not in self.frozen_groups}
            self._write(
                target,
                version,
                lambda staging: self._write_version(staging, trainable),
                frozen=frozen,
                frozen_groups=list(self.frozen_groups),
            )
        if self.queue is not None:
            self.queue.publish_weights(version, str(target))
        self.prune()
        return target

    def _frozen_dir(self, version: int, params: Any) -> str | None:
        if not self.frozen_groups or self.frozen:
            return self.frozen
        missing = [group for group in self.frozen_groups if group not in params]
        if missing:
            raise ValueError(f"the first publish of {self.directory} needs the frozen groups {missing}")
        name = f"frozen-{version_dir_name(version)}"
        frozen = {group: params[group] for group in self.frozen_groups}
        self._write(
            self.directory / name,
            version,
            lambda staging: save_tensors(self.model_config, frozen, staging / FROZEN_FILE, self.dtype),
        )
        self.frozen = name
        return name

    def _write_version(self, staging: Path, trainable: Any) -> None:
        save_tensors(self.model_config, trainable, staging / TRAINABLE_FILE, self.dtype)
        hf_config = self.model_config.to_hf_dict()
        hf_config["torch_dtype"] = str(self.dtype)
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        for file in self.extra_files:
            shutil.copy2(file, staging / Path(file).name)

    def _write(self, target: Path, version: int, write: Callable[[Path], Any], **marker: Any) -> None:
        """Writes a directory through `write(staging)`, its marker last, renamed into place."""
        if target.exists():
            self._delete(target)
        staging = self.directory / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        write(staging)
        write_complete_marker(staging, version, **marker)
        os.rename(staging, target)
        _fsync_dir(self.directory)

    def prune(self) -> list[int]:
        """Deletes all but the newest `keep` complete versions, and frozen directories no kept
        version names; returns the versions deleted."""
        versions = complete_versions(self.directory)
        old = versions[: -self.keep]
        for item in old:
            self._delete(item.path)
        named = {frozen_part(item.path).name for item in versions[-self.keep :]} | {self.frozen}
        for entry in self.directory.iterdir():
            if _FROZEN_DIR.match(entry.name) and entry.name not in named:
                self._delete(entry)
        return [item.version for item in old]

    def _delete(self, path: Path) -> None:
        trash = path.with_name(f".{path.name}.trash-{uuid.uuid4().hex[:8]}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _remove_debris(self) -> None:
        """Staging and trash directories left by a crashed publisher (one publisher per dir)."""
        for entry in self.directory.iterdir():
            if entry.name.startswith((".v", ".frozen-v")) and (".partial-" in entry.name or ".trash-" in entry.name):
                shutil.rmtree(entry, ignore_errors=True)


class WeightsWatcher:
    """A worker's side: loads the announced version into its engine when it changes.

    `poll()` is cheap (one queue read) and is called between groups; it loads only complete
    versions and leaves the engine untouched when the announced one is not (yet) complete.
    The frozen tower is read once and reused while the versions name the same one.
    """

    def __init__(self, queue: TrajectoryQueue, engine: Engine, *, dtype: Any = None) -> None:
        self.queue = queue
        self.engine = engine
        self.dtype = dtype
        self.frozen: FrozenTower | None = None

    def poll(self) -> int | None:
        """Loads the announced weights if their version differs from the engine's; returns
        the version loaded, or None when nothing was loaded."""
        announced = self.queue.latest_weights()
        if announced is None or announced.version == self.engine.version:
            return None
        try:
            frozen = frozen_part(announced.location)
            version, _, params = load_weights(announced.location, self.dtype, self.frozen)
        except IncompleteWeightsError as error:
            logger.warning("announced weights version %d not loadable yet: %s", announced.version, error)
            return None
        if frozen.name is not None:
            self.frozen = FrozenTower(frozen.name, {group: params[group] for group in frozen.groups})
        self.engine.update_weights(params, version)
        logger.info("loaded weights version %d from %s", version, announced.location)
        return version


def open_hf_tensors(path: str | os.PathLike) -> tuple[int, Iterator[tuple[str, Any]]]:
    """(version, (tensor name, torch tensor) pairs) of the complete published version at `path`:
    its trainable tensors and those of the frozen tower it names, as stored (bf16).

    Every safetensors file is opened (memory-mapped) before the version is checked complete a
    second time, so a version pruned while its tensors stream out still yields all of them.
    """
    version = check_complete(path)
    try:
        handles = [safe_open(str(f), framework="pt") for f in published_files(path)]
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
