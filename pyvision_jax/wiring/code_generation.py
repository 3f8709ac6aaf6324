"""XLA's code generation for a run: the LLVM optimization level its backend compiles with.

On CPU a short run spends much of its time compiling. Level 1 compiles the executables faster
and, for the small model's decode, prefill and train steps, runs them as fast
(docs/performance.md#the-main-jobs-wall-time).
The level is an XLA flag, read once when the backend starts, so it goes into XLA_FLAGS before
the first JAX computation; it applies to every executable of the process.
"""

from __future__ import annotations

import os

from jax._src import xla_bridge

FLAG = "--xla_backend_optimization_level"
LEVELS = (0, 1, 2, 3)


def use_backend_optimization_level(level: int, field: str = "train.xla_backend_optimization_level") -> str | None:
    """Adds `FLAG`=level to XLA_FLAGS (-1: leaves XLA's default); returns why it did not take
    effect, or None. A level already in XLA_FLAGS is the user's and wins; once the backend has
    started the flag is no longer read."""
    if level == -1:
        return None
    if level not in LEVELS:
        raise ValueError(f"--config.{field}={level} must be -1 (XLA's default) or one of {LEVELS}")
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return f"--config.{field}={level} not applied: XLA_FLAGS sets {FLAG} already"
    if xla_bridge.backends_are_initialized():
        return f"--config.{field}={level} not applied: JAX's backend started before it was set"
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={level}".strip()
    return None
