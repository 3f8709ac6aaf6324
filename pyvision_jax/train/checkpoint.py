"""Train checkpoints: an orbax CheckpointManager over (TrainState, cursors).

`state` is the whole `TrainState` (params, optimizer state, step, rng, skipped-update count),
saved and restored with its shardings; `cursors` is a small JSON dict of the loop's data
positions (tasks drawn, generation rounds, ...), so a resumed run continues exactly where
the saved one stood. Saves are asynchronous; `wait` blocks until they are on disk.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from pyvision_jax.train.state import TrainState


class TrainCheckpoints:
    """Keeps the last `keep` checkpoints under `directory`, saving every `every` steps."""

    def __init__(self, directory: str | os.PathLike, every: int, keep: int, async_saves: bool = True):
        if every < 1 or keep < 1:
            raise ValueError(f"train.checkpoint_every ({every}) and train.keep_checkpoints ({keep}) must be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))
        self.every = every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_saves)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "cursors"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def should_save(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, step: int, state: TrainState, cursors: dict[str, Any], force: bool = False) -> bool:
        """Starts saving (asynchronously) when `step` is due or `force`; returns whether it did."""
        if not force and not self.should_save(step):
            return False
        if step in self._manager.all_steps():
            return False
        return self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), cursors=ocp.args.JsonSave(dict(cursors))), force=True)

    def restore(self, template: TrainState, shardings: TrainState | None = None,
                step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """(state, cursors) of `step` (default: the latest), placed like `shardings`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if shardings is None:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        else:
            abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                    template, shardings)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), cursors=ocp.args.JsonRestore()))
        return restored.state, dict(restored.cursors)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
