"""Training metrics: TensorBoard scalars and a one-line console summary per step.

The tags are named in `metric_names`.

Event files are written with `tensorboard.summary.Writer` (no TensorFlow needed) over
`event_file.SynchronousEventOutput`; they read back with
`tensorboard.backend.event_processing.event_accumulator` as tensors of the "scalars" plugin.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from tensorboard.summary import Writer

from pyvision_jax.run_logs.event_file import SynchronousEventOutput
from pyvision_jax.run_logs.metric_names import (
    ACTOR_CLIPFRAC,
    ACTOR_GRAD_NORM,
    FILTER_GROUPS_KEPT,
    PERF_ROLLOUT_WAIT,
    PERF_STEP_TIME,
    PERF_TOKENS_PER_SEC,
    RESPONSE_LENGTH,
    REWARD_ACCURACY,
    REWARD_TOTAL,
    TOOLS_CALLS_PER_TRAJ,
    VAL_ACCURACY,
    VAL_RESPONSE_LENGTH,
    VAL_TOOL_CALLS,
    VERSION_STALENESS_MEAN,
)

# (tag, short label, format) of the fields in the console line, in order.
CONSOLE_FIELDS: tuple[tuple[str, str, str], ...] = (
    (REWARD_TOTAL, "reward", ".3f"),
    (REWARD_ACCURACY, "acc", ".3f"),
    (TOOLS_CALLS_PER_TRAJ, "tools", ".2f"),
    (RESPONSE_LENGTH, "len", ".0f"),
    (ACTOR_GRAD_NORM, "gnorm", ".3g"),
    (ACTOR_CLIPFRAC, "clip", ".3f"),
    (FILTER_GROUPS_KEPT, "kept", ".0f"),
    (VERSION_STALENESS_MEAN, "stale", ".2f"),
    (PERF_STEP_TIME, "step_s", ".2f"),
    (PERF_ROLLOUT_WAIT, "wait_s", ".2f"),
    (PERF_TOKENS_PER_SEC, "tok/s", ".4g"),
)


VALIDATION_FIELDS: tuple[tuple[str, str, str], ...] = (
    (VAL_ACCURACY, "acc", ".3f"),
    (VAL_TOOL_CALLS, "tools", ".2f"),
    (VAL_RESPONSE_LENGTH, "len", ".0f"),
)


def _scalar_value(tag: str, step: int, value: Any) -> float:
    array = np.asarray(value)
    where = f"metric {tag!r} at step {step}"
    if array.size != 1:
        raise ValueError(f"{where}: expected a scalar, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise ValueError(f"{where}: expected a number, got dtype {array.dtype}")
    if np.iscomplexobj(array):
        raise ValueError(f"{where}: expected a real number, got a complex value")
    return float(array.reshape(()))


def _checked_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return int(step)


def format_console_line(step: int, scalars: Mapping[str, Any], total_steps: int | None = None) -> str:
    """One concise line for a step, e.g. `step 3/10 | reward 0.512 | acc 0.438 | ...`.

    Only the `CONSOLE_FIELDS` present in `scalars` appear; non-finite values print as `nan`/`inf`.
    """
    step = _checked_step(step)
    head = f"step {step}" if total_steps is None else f"step {step}/{total_steps}"
    parts = [head]
    for tag, label, fmt in CONSOLE_FIELDS:
        if tag in scalars:
            value = _scalar_value(tag, step, scalars[tag])
            text = format(value, fmt) if math.isfinite(value) else str(value)
            parts.append(f"{label} {text}")
    return " | ".join(parts)


def format_validation_line(step: int, scalars: Mapping[str, Any]) -> str:
    """One line for a validation, e.g. `validation at step 20 | acc 0.412 | tools 1.84 | len 611`."""
    parts = [f"validation at step {_checked_step(step)}"]
    for tag, label, fmt in VALIDATION_FIELDS:
        if tag in scalars:
            parts.append(f"{label} {format(_scalar_value(tag, step, scalars[tag]), fmt)}")
    return " | ".join(parts)


class MetricsWriteError(RuntimeError):
    """TensorBoard event files could not be written (its first line names the step, the
    directory and the cause: a full disk, say)."""


class MetricsWriter:
    """Writes named scalars per step to TensorBoard event files under `logdir`.

    Records are written synchronously, so a failed write (a full disk) raises at the `write`
    that made it, in the caller's thread, as a one-line `MetricsWriteError`. Not
    thread-safe (neither is the underlying `tensorboard.summary.Writer`): call it from the
    trainer's loop only. `close()` flushes and is idempotent; the writer is a context manager.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self._logdir = os.fspath(logdir)
        os.makedirs(self._logdir, exist_ok=True)
        self._writer: Writer | None = Writer(SynchronousEventOutput(self._logdir))

    @property
    def logdir(self) -> str:
        return self._logdir

    def _open_writer(self) -> Writer:
        if self._writer is None:
            raise RuntimeError(f"MetricsWriter for {self._logdir} is closed")
        return self._writer

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Writes every (name, value) of `scalars` at `step`; values are numbers or size-1 arrays.

        All values are validated before any is written, so a bad value leaves no partial step.
        """
        writer = self._open_writer()
        step = _checked_step(step)
        checked: list[tuple[str, float]] = []
        for tag, value in scalars.items():
            if not isinstance(tag, str) or not tag or tag != tag.strip():
                raise ValueError(f"metric name must be a non-empty string without surrounding whitespace, got {tag!r}")
            checked.append((tag, _scalar_value(tag, step, value)))
        try:
            for tag, value in checked:
                writer.add_scalar(tag, value, step)
        except OSError as err:
            raise self._write_error(f"metrics of step {step}", err) from err

    def flush(self) -> None:
        try:
            self._open_writer().flush()
        except OSError as err:
            raise self._write_error("metrics", err) from err

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except OSError as err:
                raise self._write_error("metrics", err) from err

    def _write_error(self, what: str, err: OSError) -> MetricsWriteError:
        return MetricsWriteError(f"{what} in {self._logdir} not written: {err}")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
