"""The trainer's side of the shared-filesystem transport: each version written in the format
of `version_dirs` (staged, marker last, renamed into place), announced on the queue, old
versions pruned (renamed away before being deleted). One publisher per directory."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyvision_jax.convert import save_tensors
from pyvision_jax.convert.hf_config import hf_config_dict, write_hf_config
from pyvision_jax.rollout.queue import TrajectoryQueue, checked_version
from pyvision_jax.rollout.weights.version_dirs import (
    FROZEN_DIR,
    FROZEN_FILE,
    TRAINABLE_FILE,
    IncompleteWeightsError,
    check_complete,
    complete_versions,
    frozen_part,
    fsync_dir,
    version_dir_name,
    write_complete_marker,
)

logger = logging.getLogger(__name__)


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
        write_hf_config(staging, hf_config_dict(self.model_config), dtype=str(self.dtype))
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
        fsync_dir(self.directory)

    def prune(self) -> list[int]:
        """Deletes all but the newest `keep` complete versions, and frozen directories no kept
        version names; returns the versions deleted."""
        versions = complete_versions(self.directory)
        old = versions[: -self.keep]
        for item in old:
            self._delete(item.path)
        named = {frozen_part(item.path).name for item in versions[-self.keep :]} | {self.frozen}
        for entry in self.directory.iterdir():
            if FROZEN_DIR.match(entry.name) and entry.name not in named:
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
