"""Reading a complete published version (`version_dirs`): as a Flax params tree, reusing a
frozen tower already loaded, or as the stored HF tensors. Every reader checks the version
complete before and after it reads, so it never returns weights of a partial or pruned one."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterator

from safetensors import safe_open

from pyvision_jax.convert import load_hf
from pyvision_jax.rollout.weights.version_dirs import (
    IncompleteWeightsError,
    check_complete,
    frozen_part,
    latest_complete,
    published_files,
)

logger = logging.getLogger(__name__)


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
