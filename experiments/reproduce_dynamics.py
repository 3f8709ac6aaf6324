"""Reproduce the paper's learning results at toy scale: the fixed-temperature baselines, the full
recipe, its ablations and the controls, with early stopping on a validation set and bootstrap
intervals over held-out tasks.

    python -m experiments.reproduce_dynamics --workdir /tmp/dynamics [--steps 24] [--eval-every 6] \
        [--variants full,no_tool_reward,std_norm,arrival_order,turns_2,random_reward,entropy_min] \
        [--seeds 0] [--temperatures 0.1,0.3,0.6,1.0] [--validation-seed 777] [--validation-per-kind 0] \
        [--jobs 1] [--config configs/tiny_cpu.py] [--config.x=y ...]

Two task sets of the config's synthetic kinds (`data.synthetic_kinds`), both of
`eval.heldout_per_kind` tasks per kind (the validation set's: --validation-per-kind when set) and
`eval.heldout_k` rollouts per task: the validation set (synthetic seed --validation-seed) and the
held-out set (`eval.heldout_seed`). Neither seed may be a training seed, nor the two the same.
Nothing is ever chosen on the held-out set.

1. Baselines: the config's starting model (no training) at each of --temperatures on both
   sets; the temperature best on validation (the first listed among equals) gives "the best
   fixed-temperature baseline", its held-out per-task accuracies.
2. Runs: each variant of `experiments.ablations.VARIANTS` (--variants: the recipe, its
   ablations and the controls random_reward and entropy_min) trains GRPO from the same start
   for --steps steps once per seed of --seeds (`config.seed`), evaluated on both sets at the
   start (step 0: the starting model at eval.temperature) and every --eval-every steps and the
   last. Its reported result is the held-out evaluation at the step of best validation
   accuracy (ties: the earliest); the last step's is kept beside it. With --jobs N > 1 the runs
   train N at a time, each in a process of its own (this script with --runs-only, its output in
   its run directory's reproduce.log, its compiled executables in the run directory's
   jax_cache); a run that fails leaves the others' results, and this command then names it and
   exits 1 (a rerun resumes it). SIGTERM or Ctrl-C stops the running ones, each saving its
   checkpoint.
3. Statistics per run (`experiments.dynamics_stats`): held-out accuracy early-stopped and last with
   95 % bootstrap intervals over tasks, the paired interval of (early-stopped - best
   baseline) and of (last - start), tool calls per trajectory (held-out start and end, the
   training curve's last value) and their ratio to the full recipe's of the same seed, plan
   shares (`data.shape_plans.plan_of`) on held-out at the start, the early-stopped step and
   the end, over all tasks and by task family, wall time; the paired interval of
   (early-stopped - best input-independent policy) and of (last - that policy), the policy
   chosen on validation among the fixed temperatures, each constant answer and each plan
   forced on every task (`experiments.fixed_policies`, its forced plans' evaluations in
   WORKDIR/baselines/forced); and per seed the checks of the learning claims, with the tool-call claims
   checked again on the means over the seeds when there are several
   (`experiments.dynamics_stats.claim_checks`).

Writes WORKDIR/validation/tasks and WORKDIR/heldout/tasks; WORKDIR/baselines/seed_<S>/T_<T>
(the starting model's evaluations); WORKDIR/<variant>/seed_<S>/ (TensorBoard under tb/ with
heldout/* and validation/* scalars, checkpoints, validation/step_N and heldout/step_N
evaluations, wall_time.json); WORKDIR/results.json (keys: command, steps, eval_every, seeds,
variants, validation, heldout, baselines, input_independent, start, runs, claims, wall_time_s);
WORKDIR/dynamics.png (held-out accuracy with the best baseline and the start, training
accuracy, tool calls, careful-plan share, entropy, response length: one line per variant, the
mean over seeds); WORKDIR/plans.png (held-out plan shares at the start and the end per
variant); WORKDIR/plans_by_family.png (on toys with two task families: each run's held-out
plan shares per family at the start and the early-stopped step); WORKDIR/results.md (the
baseline, the tables, the claim checks). Rerunning resumes the runs and reuses every finished
evaluation.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from experiments.ablations import VARIANTS
from experiments.baseline_runs import (
    heldout_set,
    start_evaluations,
    temperature_baselines,
    validation_set,
)
from experiments.baselines import HELDOUT
from experiments.dynamics_figures import plot_dynamics, plot_plans, plot_plans_by_family
from experiments.dynamics_runs import check_seeds, run_dir, run_variant
from experiments.dynamics_stats import claim_checks, run_records, statistics_by_run
from experiments.dynamics_tables import results_markdown
from experiments.fixed_policies import fixed_policy_baselines
from experiments.run_processes import Command, run_commands
from pyvision_jax import wiring
from pyvision_jax.cli.entry import run_command
from pyvision_jax.wiring.compilation_cache import COMPILATION_CACHE_DIR

ROOT = Path(__file__).resolve().parents[1]
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "tiny_cpu.py"), "Base config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (one run directory per variant and seed).")
_STEPS = flags.DEFINE_integer("steps", 24, "GRPO steps per run.")
_EVAL_EVERY = flags.DEFINE_integer("eval-every", 6, "Validation and held-out evaluation every this many steps.")
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), "Variants to run, comma-separated.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds (config.seed) each variant runs with, comma-separated.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.1", "0.3", "0.6", "1.0"], "Baseline sampling temperatures.")
_VALIDATION_SEED = flags.DEFINE_integer(
    "validation-seed", 777, "Synthetic seed of the validation set (temperature choice, early stopping)."
)
_VALIDATION_PER_KIND = flags.DEFINE_integer(
    "validation-per-kind",
    0,
    "Tasks per kind of the validation set (0: eval.heldout_per_kind, the held-out set's); a test set "
    "larger than the validation set buys a narrower interval without changing the early stopping.",
)
_JOBS = flags.DEFINE_integer("jobs", 1, "Runs trained at once, each in a process of its own (1: one after another).")
_RUNS_ONLY = flags.DEFINE_bool(
    "runs-only",
    False,
    "Train and evaluate the runs, without results, tables or figures (what each --jobs process does).",
)

RUN_LOG = "reproduce.log"


def log(line: str) -> None:
    print(line, flush=True)


def train_in_processes(runs: list[tuple[str, int]], workdir: Path) -> None:
    """Trains and evaluates each (variant, seed) of `runs` in a process of its own, --jobs at a
    time; exits 1 naming every run that failed, after the others have finished."""
    commands = []
    for name, seed in runs:
        out_dir = run_dir(workdir, VARIANTS[name], seed)
        only_this = (f"--variants={name}", f"--seeds={seed}", "--jobs=1", "--runs-only")  # the last value wins
        argv = (sys.executable, "-m", __spec__.name, *sys.argv[1:], *only_this)  # this module, from the same directory
        # a compilation cache per run: JAX writes its cache entries in place, so no two processes share one
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(out_dir / COMPILATION_CACHE_DIR)}
        commands.append(Command(f"{name} seed {seed}", argv, out_dir / RUN_LOG, env))
    failed = [
        f"{outcome.name} (exit {outcome.returncode}, output: {outcome.log_path})"
        for outcome in run_commands(commands, _JOBS.value, log)
        if outcome.returncode != 0
    ]
    if failed:
        sys.exit(
            f"error: {len(failed)} of {len(runs)} runs failed: {'; '.join(failed)}; "
            "the other runs' results are kept and a rerun resumes"
        )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    config, workdir = _CONFIG.value, Path(_WORKDIR.value).absolute()
    try:
        seeds = [int(s) for s in _SEEDS.value]
        temperatures = [float(t) for t in _TEMPERATURES.value]
        heldout = heldout_set(config)
        validation = validation_set(config, _VALIDATION_SEED.value, _VALIDATION_PER_KIND.value)
        check_seeds(config, seeds)
        if not temperatures or min(temperatures) <= 0:
            raise ValueError(f"--temperatures must be > 0, got {_TEMPERATURES.value}")
        if _JOBS.value < 1:
            raise ValueError(f"--jobs must be >= 1, got {_JOBS.value}")
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    workdir.mkdir(parents=True, exist_ok=True)
    # each segment and evaluation builds its engine and train step anew: compile each shape once
    wiring.use_compilation_cache(workdir)
    begin = time.perf_counter()
    baselines = temperature_baselines(config, workdir, temperatures, validation, heldout, log)
    best = baselines.best
    log(f"best fixed temperature on validation: T {baselines.best_temperature:g}; held-out {best.summary()}")
    start = start_evaluations(config, workdir, (validation, heldout))
    baseline_time = round(time.perf_counter() - begin, 1)
    pairs = [(name, seed) for name in _VARIANTS.value for seed in seeds]
    if _JOBS.value > 1 and len(pairs) > 1:
        train_in_processes(pairs, workdir)  # what follows then reuses every finished step and evaluation
    runs = [
        run_variant(
            config, VARIANTS[name], seed, workdir, _STEPS.value, _EVAL_EVERY.value, validation, heldout, start, log
        )
        for name, seed in pairs
    ]
    if _RUNS_ONLY.value:
        return
    fixed = fixed_policy_baselines(config, workdir, validation, heldout, baselines)
    log(f"best input-independent policy on validation: {fixed.best.name}")
    records = run_records(runs, best, fixed.best)
    checks = claim_checks(statistics_by_run(records))
    baselines_record = baselines.as_dict()
    results = {
        "command": " ".join(sys.argv),
        "steps": _STEPS.value,
        "eval_every": _EVAL_EVERY.value,
        "seeds": seeds,
        "variants": list(_VARIANTS.value),
        "validation": validation.as_dict(),
        "heldout": heldout.as_dict(),
        "baselines": baselines_record,
        "input_independent": fixed.as_dict(),
        "start": {
            "temperature": float(config.eval.temperature),
            **{name: summary.as_dict() for name, summary in start.items()},
        },
        "runs": records,
        "claims": checks,
        "wall_time_s": {
            "total": round(time.perf_counter() - begin, 1),
            "baselines": baseline_time,
            "runs": {f"{r['name']}/seed_{r['seed']}": r["wall_time_s"] for r in records},
        },
    }
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    seeds_text = ("seed " if len(seeds) == 1 else "seeds ") + ",".join(map(str, seeds))
    plot_dynamics(
        records,
        workdir / "dynamics.png",
        title=f"GRPO to step {_STEPS.value}, {seeds_text}, held-out seed {heldout.seed}",
        baseline=best.accuracy,
        start=start[HELDOUT].accuracy,
        baseline_label=f"best fixed T {baselines.best_temperature:g}",
    )
    plot_plans(records, workdir / "plans.png", title=f"held-out plan shares, {seeds_text}")
    by_family = plot_plans_by_family(
        records, workdir / "plans_by_family.png", title=f"held-out plan shares by task family, seed {heldout.seed}"
    )
    markdown = results_markdown(
        records, baselines_record, checks, validation.seed, heldout.seed, results["input_independent"]
    )
    (workdir / "results.md").write_text(markdown + "\n")
    print(markdown)
    figures = [workdir / "dynamics.png", workdir / "plans.png"] + (
        [workdir / "plans_by_family.png"] if by_family else []
    )
    print(
        f"results: {workdir / 'results.json'}, {workdir / 'results.md'}; figures: {', '.join(map(str, figures))}; "
        f"wall time {results['wall_time_s']['total']:.0f} s"
    )


if __name__ == "__main__":
    run_command(__name__, main)
