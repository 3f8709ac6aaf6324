"""One prepared accelerator check, on whatever backend JAX sees, in one call.

    python -m benchmarks.accelerator_suite [--out results.json] [--sections parity,step,...]
        [--sizes auto|cpu|gpu|tpu] [--budget-s 480]

Sections (benchmarks/accelerator/, sizes per backend in sizes.py; tiny on CPU):
  environment  versions, devices, whether cuDNN's packed attention layout exists
  parity       the small SFT model's bf16 logits vs fp32, fp32 vs transformers (where torch
               sees the device)
  step         the GRPO train step at Qwen2.5-VL-7B width, 2 and 4 decoder layers, packed
               rows of 8k and 32k tokens, the 7B recipe's remat and scan: measured peak
               memory vs memory_analysis(), step time, tokens/s, MFU, per-layer figures and
               the 28-layer extrapolation; a profile of the largest step
  attention    blockwise / cuDNN / splash forward+backward at 8k and 32k: time, memory and
               equality to blockwise
  decode       JaxEngine tokens/s at batch 64 on the small model and a 7B-width slice

Each section runs in its own process under a time limit (its budget, and never past the
whole run's `--budget-s`), writing its results as it goes, so a section that fails, runs
out of memory or out of time loses only itself. At the end: one table on stdout and every
figure in `--out` (JSON). Exit status 1 when a section did not finish. docs/accelerator_suite.md
has the H200 sizing arithmetic and how to run this on the device machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.accelerator.records import SectionLog, read_section
from benchmarks.accelerator.report import table
from benchmarks.accelerator.sizes import ENVIRONMENT_S, SECTIONS, sizes_for

ROOT = Path(__file__).resolve().parents[1]

RUNNERS = {
    "environment": "environment",
    "parity": "parity",
    "step": "train_width",
    "attention": "attention_kernels",
    "decode": "decode",
}
"""Section -> module of benchmarks/accelerator/ with its `run(sizes, log)`; imported only in
that section's own process (the parent never starts a JAX backend)."""
SECTION_ENV = {
    "parity": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "step": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"},
    "attention": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"},
}
"""Parity shares the GPU with torch; the step and attention sections may use nearly all of it."""
MIN_SECTION_S = 10.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results.json", help="the results file (JSON)")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS[1:]),
        help=f"comma-separated, of {', '.join(SECTIONS[1:])} (environment always runs)",
    )
    parser.add_argument("--sizes", default="auto", help="auto (by backend), cpu, gpu or tpu")
    parser.add_argument("--budget-s", type=float, default=480.0, help="wall-clock limit of the whole run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--partial", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def run_child(section: str, kind: str, partial: Path) -> None:
    """Inside a section's process: run it and leave its results in `partial`."""
    log = SectionLog(section, partial)
    try:
        module = importlib.import_module(f"benchmarks.accelerator.{RUNNERS[section]}")
        module.run(None if kind == "auto" else sizes_for(kind), log)
    except Exception as error:  # noqa: BLE001 (recorded, then the process exits non-zero)
        log.fail(error)
        sys.exit(1)
    log.finish()


def run_section(section: str, kind: str, timeout_s: float, workdir: Path, xla_flags: str = "") -> dict:
    """Runs one section in its own process group, killed at `timeout_s`."""
    partial = workdir / f"{section}.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    for key, value in SECTION_ENV.get(section, {}).items():
        env.setdefault(key, value)
    command = [
        sys.executable,
        "-m",
        "benchmarks.accelerator_suite",
        "--child",
        section,
        "--sizes",
        kind,
        "--partial",
        str(partial),
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        process.wait(timeout=timeout_s)
        status = None
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = "timed out"
    result = read_section(partial, section)
    if status or (result["status"] == "running" and process.returncode):
        result["status"] = status or f"exited {process.returncode}"
    result |= {"wall_s": time.perf_counter() - start, "timeout_s": timeout_s}
    return result


def main() -> None:
    args = parse_args()
    if args.child:
        run_child(args.child, args.sizes, Path(args.partial))
        return
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS[1:]))
    if unknown:
        sys.exit(f"--sections: unknown {unknown}; choose from {list(SECTIONS[1:])}")
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = out.parent / f".{out.stem}_sections"
    workdir.mkdir(exist_ok=True)
    start = time.perf_counter()
    deadline = start + args.budget_s
    environment = run_section("environment", args.sizes, min(ENVIRONMENT_S, args.budget_s), workdir)
    results = {"environment": environment}
    kind = args.sizes
    if kind == "auto":
        kind = next((r["metrics"].get("backend") for r in environment["records"]), None) or "cpu"
    sizes = sizes_for(kind)
    for section in sections:
        timeout_s = min(sizes.budget(section), deadline - time.perf_counter())
        if timeout_s < MIN_SECTION_S:
            results[section] = {
                "section": section,
                "status": "skipped: run budget spent",
                "error": None,
                "records": [],
                "wall_s": 0.0,
                "timeout_s": max(timeout_s, 0.0),
            }
            continue
        results[section] = run_section(section, kind, timeout_s, workdir, sizes.xla_flags)
    total_s = time.perf_counter() - start
    out.write_text(
        json.dumps(
            {
                "suite": {"sizes": kind, "budget_s": args.budget_s, "total_s": total_s, "sections": sections},
                "sections": results,
            },
            indent=1,
        )
    )
    print(f"\naccelerator suite: sizes {kind!r}, {total_s:.0f} s of {args.budget_s:.0f} s; results in {out}\n")
    print(table(results))
    sys.exit(0 if all(r["status"] == "done" for r in results.values()) else 1)


if __name__ == "__main__":
    main()
