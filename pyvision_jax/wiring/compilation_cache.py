"""JAX's persistent compilation cache for a run's workdir."""

from __future__ import annotations

import os
from pathlib import Path

import jax

from pyvision_jax.convert.run_layout import COMPILATION_CACHE_DIR


def use_compilation_cache(workdir: str | os.PathLike) -> Path:
    """Keeps compiled XLA executables in WORKDIR/jax_cache, unless a cache is already set
    (JAX_COMPILATION_CACHE_DIR or jax.config); returns the directory in use.

    A run builds several engines and train steps over the same shapes (the held-out evaluation
    before training, the rollout engine, the evaluation after, each resumed segment): with the
    cache each shape compiles once per workdir, and a rerun in the same workdir compiles
    nothing. Call it before the first compilation: JAX reads the setting once.
    """
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(Path(workdir).absolute() / COMPILATION_CACHE_DIR))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    return Path(jax.config.jax_compilation_cache_dir)
