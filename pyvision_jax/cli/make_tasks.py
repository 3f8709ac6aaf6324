"""Write a synthetic task file and its media (the generator the trainer uses).

    pyvision-make-tasks --out /tmp/tasks --per-kind 8 --seed 7 [--kinds visual_search,counting,video]

One JSONL file per kind (`DIR/<kind>.jsonl`, media beside it) plus `DIR/tasks.jsonl` with
every task, ready for `pyvision-eval --data`. Seeds used in training: data.synthetic_seed
(RL, default 0) and sft.synthetic_seed (SFT, default 1000); evaluate on another seed.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from pyvision_jax.cli.entry import run_command
from pyvision_jax.cli.user_errors import bad_input_exits
from pyvision_jax.data import synthetic
from pyvision_jax.data.tasks import load_tasks

PROGRAM = "pyvision-make-tasks"
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_PER_KIND = flags.DEFINE_integer("per-kind", 8, "Tasks per kind.")
_SEED = flags.DEFINE_integer("seed", None, "Generator seed (every file depends only on seed, kind, index).")
_KINDS = flags.DEFINE_list(
    "kinds", list(synthetic.DEFAULT_KINDS), f"Kinds, comma-separated, of {list(synthetic.GENERATORS)}."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _OUT.value or _SEED.value is None:
        raise app.UsageError("--out and --seed are required")
    with bad_input_exits(PROGRAM):
        if _PER_KIND.value < 1:
            raise ValueError(f"--per-kind must be >= 1, got {_PER_KIND.value}")
        unknown = sorted(set(_KINDS.value) - set(synthetic.GENERATORS))
        if unknown:
            raise ValueError(f"--kinds: unknown kinds {unknown}; known: {sorted(synthetic.GENERATORS)}")
    path = synthetic.write_synthetic_task_file(
        _OUT.value, _PER_KIND.value, _SEED.value, tuple(_KINDS.value), progress=True
    )
    for kind in _KINDS.value:
        print(f"{kind}: {Path(_OUT.value) / (kind + '.jsonl')}")
    print(f"all {len(load_tasks(path).tasks)} tasks: {path}")


def run() -> None:
    """The `pyvision-make-tasks` console command."""
    run_command(__name__, main)
