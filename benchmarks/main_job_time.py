"""Wall time of the main job (README's first command after the install) from a fresh workdir,
against the same job with the engine and compiler settings it had before, in one run.

    .venv/bin/python -m benchmarks.main_job_time [--pairs 2] [--out main_job.json] [--config.x=y ...]

Each run is `launch/train.py --config configs/tiny_cpu.py` in a child process with a new
workdir (so no compilation cache), the two variants alternating:
- `default`: the config as it is;
- `reference`: 32 engine slots and episodes in flight, every dispatch at 32 rows, and XLA's
  default LLVM optimization level (`REFERENCE`).
It prints each run's wall time, training-step and rollout-wait seconds and held-out figures, the
ratio of the reference's median wall time to the default's, and whether the held-out figures of
every run are identical. `--config.x=y` arguments go to every run (a miniature: fewer steps).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import describe_machine

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/tiny_cpu.py"
REFERENCE = (
    "--config.episode.max_concurrent=32",
    "--config.rollout.max_batch=32",
    "--config.rollout.batch_sizes=(32,)",
    "--config.train.xla_backend_optimization_level=-1",
)
VARIANTS = {"reference": REFERENCE, "default": ()}
STEP_LINE = re.compile(r"^step (\d+)/\d+ \|.*\| step_s ([\d.]+) \| wait_s ([\d.]+) \|", re.M)


def run_job(variant: str, overrides: list[str], workdir: Path) -> dict:
    """One run of the job in a fresh workdir: its wall time, step lines and held-out summary."""
    command = [sys.executable, "launch/train.py", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress"]
    command += [*VARIANTS[variant], *overrides]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"main_job_time: the {variant} run failed (status {done.returncode}):\n{done.stderr[-3000:]}")
    steps = [{"step": int(s), "step_s": float(t), "wait_s": float(w)} for s, t, w in STEP_LINE.findall(done.stdout)]
    heldout = heldout_figures(json.loads((workdir / "heldout" / "summary.json").read_text()))
    return {"variant": variant, "wall_s": wall, "steps": steps, "heldout": heldout}


def heldout_figures(heldout: dict) -> dict:
    """The figures the job prints (accuracy, tool calls, plan shares), without paths."""
    return {
        name: {k: v for k, v in part.items() if k != "out_dir"} if isinstance(part, dict) else part
        for name, part in heldout.items()
    }


def summarize(runs: list[dict]) -> dict:
    walls = {name: [r["wall_s"] for r in runs if r["variant"] == name] for name in VARIANTS}
    medians = {name: statistics.median(w) for name, w in walls.items()}
    figures = [r["heldout"] for r in runs]
    return {
        "median_wall_s": medians,
        "ratio_reference_to_default": medians["reference"] / medians["default"],
        "heldout_identical": all(f == figures[0] for f in figures),
    }


def accuracy_line(heldout: dict) -> str:
    parts = [f"{name} {part['accuracy']:.3f}" for name, part in heldout.items() if "accuracy" in part]
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args, overrides = parser.parse_known_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    unknown = [o for o in overrides if not o.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (only --config.x=y goes to the runs)")
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for pair in range(args.pairs):
            for variant in VARIANTS:
                run = run_job(variant, overrides, Path(root) / f"{variant}_{pair}")
                runs.append(run)
                waited = sum(s["wait_s"] for s in run["steps"])
                trained = sum(s["step_s"] for s in run["steps"])
                print(
                    f"{variant:9s} run {pair}: {run['wall_s']:6.1f} s wall | train steps {trained:5.1f} s | "
                    f"rollout waits {waited:5.1f} s | held-out {accuracy_line(run['heldout'])}",
                    flush=True,
                )
    summary = summarize(runs)
    medians = summary["median_wall_s"]
    print(
        f"median wall: default {medians['default']:.1f} s, reference {medians['reference']:.1f} s; "
        f"reference / default: {summary['ratio_reference_to_default']:.2f}x; "
        f"held-out figures identical in every run: {summary['heldout_identical']}"
    )
    if args.out:
        report = {
            "command": " ".join(["python -m benchmarks.main_job_time", *sys.argv[1:]]),
            "job": f".venv/bin/python launch/train.py --config {CONFIG} --workdir WORKDIR (fresh)",
            "reference_overrides": list(REFERENCE),
            "overrides": overrides,
            "machine": describe_machine(),
            **summary,
            "runs": runs,
        }
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
