"""Reproduce the paper's training dynamics and ablations at toy scale.

    python benchmarks/reproduce_dynamics.py --workdir /tmp/dynamics [--steps 24] [--eval-every 6] \
        [--variants full,no_tool_reward,std_norm,arrival_order,turns_2] [--config.x=y ...]

From the config's starting model (configs/tiny_cpu.py: the packaged SFT checkpoint of the
small model) each variant of `pyvision_jax.eval.ablations.VARIANTS` runs GRPO on the same
synthetic tasks with the same seeds; the held-out set (`eval.heldout_*`, a seed never
trained on) is evaluated once before training and every `--eval-every` steps. Writes
WORKDIR/<variant>/ (TensorBoard, checkpoints, held-out evaluations), WORKDIR/results.json,
WORKDIR/dynamics.png (the variants side by side) and WORKDIR/results.md (the table).
Rerunning resumes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

ROOT = Path(__file__).resolve().parents[1]

from pyvision_jax import wiring  # noqa: E402
from pyvision_jax.eval.ablations import VARIANTS  # noqa: E402
from pyvision_jax.eval.dynamics_figures import plot_dynamics, results_table  # noqa: E402
from pyvision_jax.wiring.dynamics_runs import run_variant  # noqa: E402
from pyvision_jax.wiring.heldout import evaluate_heldout  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "tiny_cpu.py"), "Base config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (one run directory per variant).")
_STEPS = flags.DEFINE_integer("steps", 24, "GRPO steps per variant.")
_EVAL_EVERY = flags.DEFINE_integer("eval-every", 6, "Held-out evaluation every this many steps.")
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), "Variants to run, comma-separated.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    config, workdir = _CONFIG.value, Path(_WORKDIR.value).absolute()
    if not config.eval.heldout_per_kind:
        raise app.UsageError("the config has no held-out set: set --config.eval.heldout_per_kind > 0")
    workdir.mkdir(parents=True, exist_ok=True)
    # each segment and evaluation builds its engine and train step anew: compile each shape once
    wiring.use_compilation_cache(workdir)
    start = time.perf_counter()
    before = evaluate_heldout(config, workdir, None, "before")
    print(f"held-out before training: {before.summary()}", flush=True)
    runs, times = [], {}
    for name in _VARIANTS.value:
        begin = time.perf_counter()
        runs.append(
            run_variant(
                config,
                VARIANTS[name],
                workdir,
                _STEPS.value,
                _EVAL_EVERY.value,
                before,
                log=lambda line: print(line, flush=True),
            )
        )
        times[name] = round(time.perf_counter() - begin, 1)
    results = {
        "command": " ".join(sys.argv),
        "steps": _STEPS.value,
        "eval_every": _EVAL_EVERY.value,
        "heldout": {
            "per_kind": config.eval.heldout_per_kind,
            "seed": config.eval.heldout_seed,
            "k": config.eval.heldout_k,
        },
        "wall_time_s": {"total": round(time.perf_counter() - start, 1), **times},
        "runs": runs,
    }
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    plot_dynamics(
        runs,
        workdir / "dynamics.png",
        title=f"{_STEPS.value} GRPO steps per variant, held-out seed {config.eval.heldout_seed}",
    )
    table = results_table(runs)
    (workdir / "results.md").write_text(table + "\n")
    print(table)
    print(
        f"results: {workdir / 'results.json'}, figure: {workdir / 'dynamics.png'}; "
        f"wall time {results['wall_time_s']['total']:.0f} s"
    )


if __name__ == "__main__":
    app.run(main)
