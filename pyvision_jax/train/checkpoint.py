"""Train checkpoints: an orbax CheckpointManager over (TrainState, cursors).

`state` is the whole `TrainState` (params, optimizer state, step, rng, skipped-update count),
saved and restored with its shardings; `cursors` is a small JSON dict of the loop's data
positions (tasks drawn, generation rounds, ...), so a resumed run continues exactly where
the saved one stood. Saves are asynchronous; `wait` blocks until they are on disk and raises
a `CheckpointWriteError` naming the step and the cause (a full disk, say) when a save failed.
`restore_intact` falls back from an unreadable checkpoint to the newest readable one and moves
each unreadable one aside (`QUARANTINE_DIR` beside the checkpoints), so the step it held is
saved afresh when the run redoes it and later restarts do not stumble on it again.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from pyvision_jax.convert.orbax_reports import drop_stray_orbax_reports, first_line, quiet_orbax
from pyvision_jax.convert.run_layout import CURSORS_ITEM, QUARANTINE_DIR, STATE_ITEM
from pyvision_jax.train.state import TrainState

logger = logging.getLogger(__name__)

"""Beside the checkpoint directory: unreadable checkpoints moved aside, as STEP-TIMESTAMP."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (its first line names the step and the cause)."""


class NoIntactCheckpointError(RuntimeError):
    """Every checkpoint in the directory is unreadable."""


class TrainCheckpoints:
    """Keeps the last `keep` checkpoints under `directory`, saving every `every` steps."""

    def __init__(self, directory: str | os.PathLike, every: int, keep: int, async_saves: bool = True):
        if every < 1 or keep < 1:
            raise ValueError(f"train.checkpoint_every ({every}) and train.keep_checkpoints ({keep}) must be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))
        self.every = every
        drop_stray_orbax_reports()  # a failed asynchronous save leaves such reports too
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_saves)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(STATE_ITEM, CURSORS_ITEM))

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
        self.wait()  # surfaces the previous save's failure now, not steps later
        try:
            return self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), cursors=ocp.args.JsonSave(dict(cursors))),
                force=True,
            )
        except Exception as error:  # noqa: BLE001 - orbax raises many types; all mean "not saved"
            raise CheckpointWriteError(
                f"checkpoint step {step} in {self.directory} not written: {first_line(error)}"
            ) from error

    def restore(
        self, template: TrainState, shardings: TrainState | None = None, step: int | None = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """(state, cursors) of `step` (default: the latest), placed like `shardings`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if shardings is None:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        else:
            abstract = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), template, shardings
            )
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), cursors=ocp.args.JsonRestore())
        )
        return restored.state, dict(restored.cursors)

    def restore_intact(
        self, template: TrainState, shardings: TrainState | None = None, warn: Callable[[str], None] = logger.warning
    ) -> tuple[int, TrainState, dict[str, Any]]:
        """(step, state, cursors) of the newest checkpoint that restores; each unreadable newer
        one is skipped with a one-line warning naming it."""
        steps = sorted(self.all_steps(), reverse=True)
        for step in steps:
            try:
                with quiet_orbax():
                    state, cursors = self.restore(template, shardings, step)
            except Exception as error:  # noqa: BLE001 - a damaged checkpoint fails in many ways
                moved = self.quarantine(step)
                warn(
                    f"checkpoint step {step} in {self.directory} is unreadable ({first_line(error)}); moved to "
                    f"{moved}; trying an older one"
                )
                continue
            return step, state, cursors
        raise NoIntactCheckpointError(
            f"no readable checkpoint in {self.directory} (steps {steps} all failed); "
            f"move the directory away to start afresh"
        )

    def quarantine(self, step: int) -> Path:
        """Moves checkpoint `step` aside (see `QUARANTINE_DIR`) and returns where it went."""
        target = Path(self.directory).parent / QUARANTINE_DIR / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(os.path.join(self.directory, str(step)), target)
        self._manager.reload()
        return target

    def wait(self) -> None:
        """Blocks until pending saves are on disk; raises `CheckpointWriteError` if one failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001
            raise CheckpointWriteError(
                f"a checkpoint in {self.directory} was not written: {first_line(error)}"
            ) from error

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()
