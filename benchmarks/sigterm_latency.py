"""Seconds from SIGTERM to a saved checkpoint and exit, with rollouts in flight, on the main
job's configuration (configs/kinds_cpu.py; the held-out evaluations off, since SIGTERM skips
the one after training and the one before runs before the handler is installed):

    .venv/bin/python -m benchmarks.sigterm_latency [--workdir DIR] [--after-s 8]

It starts the training command, waits for step 1's console line, lets the next rollout
round run for --after-s seconds, sends SIGTERM and prints how long the command took to save
its checkpoint and exit (schedulers give 30 s, Kubernetes' default grace period), with the
checkpoint step it left.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pyvision_jax.train.checkpoint import TrainCheckpoints

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None, help="run directory (default: a new temporary one)")
    parser.add_argument("--after-s", type=float, default=8.0, help="seconds into the second rollout round")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sigterm-"))
    command = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        "--config",
        str(ROOT / "configs" / "kinds_cpu.py"),
        f"--workdir={workdir}",
        "--config.eval.heldout_per_kind=0",
        "--config.train.steps=100",
        "--progress=false",
    ]
    trainer = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    lines: list[str] = []
    step_one = threading.Event()

    def read() -> None:
        for line in trainer.stdout:
            lines.append(line.rstrip())
            if line.startswith("step 1/"):
                step_one.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not step_one.wait(1800):
        trainer.kill()
        raise SystemExit("no step 1 within 30 minutes:\n" + "\n".join(lines[-30:]))
    time.sleep(args.after_s)
    sent = time.perf_counter()
    trainer.send_signal(signal.SIGTERM)
    status = trainer.wait(timeout=300)
    elapsed = time.perf_counter() - sent
    reader.join(timeout=10)
    step = TrainCheckpoints(workdir / "checkpoints", 1, 3).latest_step()
    print("\n".join(lines[-4:]))
    print(
        f"SIGTERM {args.after_s:.0f} s into step 2's rollouts -> exit status {status} after {elapsed:.1f} s; "
        f"checkpoint step {step} in {workdir / 'checkpoints'}"
    )


if __name__ == "__main__":
    main()
