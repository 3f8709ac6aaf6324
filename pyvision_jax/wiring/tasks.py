"""The `data` section: the training tasks (files or synthetic suites) and their order's seed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ml_collections

from pyvision_jax.data import synthetic
from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.wiring.config_values import str_tuple

logger = logging.getLogger(__name__)

TASKS_DIR = "tasks"


def training_tasks(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> list[Task]:
    """Tasks of data.train_files, or synthetic tasks generated on first use under workdir/tasks."""
    files = list(str_tuple(config.data.train_files, "data.train_files"))
    if not files:
        kinds = str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
        unknown = sorted(set(kinds) - set(synthetic.GENERATORS))
        if unknown:
            raise ValueError(f"data.synthetic_kinds: unknown kinds {unknown}; known: {sorted(synthetic.GENERATORS)}")
        out_dir = Path(workdir) / TASKS_DIR
        for kind in kinds:
            path = out_dir / f"{kind}.jsonl"
            if not path.is_file():
                synthetic.GENERATORS[kind](out_dir, config.data.synthetic_per_kind, config.data.synthetic_seed)
            files.append(str(path))
    tasks: list[Task] = []
    for path in files:
        tasks.extend(task_file(config, path))
    return tasks


def task_file(config: ml_collections.ConfigDict, path: str | os.PathLike) -> tuple[Task, ...]:
    """The tasks of one file under `data.skip_bad_rows` / `data.extra_fields`; skipped rows are
    reported (how many, and the first reasons), never dropped silently."""
    loaded = load_tasks(
        path,
        skip_bad_rows=bool(config.data.skip_bad_rows),
        extra_fields=str_tuple(config.data.extra_fields, "data.extra_fields"),
    )
    if loaded.skipped:
        reasons = "; ".join(row.reason for row in loaded.skipped[:3])
        logger.warning(
            "%s: skipped %d bad row(s) of %d (data.skip_bad_rows): %s%s",
            path,
            loaded.num_skipped,
            loaded.num_skipped + len(loaded.tasks),
            reasons,
            " ..." if loaded.num_skipped > 3 else "",
        )
    if not loaded.tasks:
        raise ValueError(f"{path}: no usable tasks ({loaded.num_skipped} row(s) skipped)")
    return loaded.tasks


def task_order_seed(config: ml_collections.ConfigDict) -> int:
    return int(config.data.synthetic_seed + config.seed)
