"""SFT runs as a user runs them: a run killed with SIGKILL mid-run and rerun ends with the
same weights, TensorBoard scalars and export as one that never stopped; and SFT as two
`jax.distributed` processes on loopback (2 CPU devices each) trains as one process with 4
devices, process 0 alone writing TensorBoard and the export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from pyvision_jax.convert import load_hf
from pyvision_jax.run_logs import metric_names as tags
from tests.train.tensorboard_events import read_scalars
from tests.train.test_multihost import environment, run_processes
from tests.train.test_sft import _write_file

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5


def sft_command(workdir: Path, sft_file: Path, steps: int, kill_at: int = 0):
    def command(coordinator: str, processes: int, index: int) -> list[str]:
        extra = [coordinator, str(processes), str(index)] if coordinator else []
        return [
            sys.executable,
            "-m",
            "tests.train.sft_run",
            str(workdir),
            str(sft_file),
            str(steps),
            str(kill_at),
            *extra,
        ]

    return command


def exported(workdir: Path):
    return jax.tree.leaves(load_hf(workdir / "hf", progress=False)[1])


def losses(workdir: Path) -> list[tuple[int, float]]:
    return read_scalars(str(workdir / "tb"))[tags.SFT_LOSS]


def test_sft_killed_mid_run_and_rerun_equals_an_uninterrupted_run(tmp_path):
    sft_file = _write_file(tmp_path)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_processes(sft_command(whole, sft_file, STEPS), 1, tmp_path, "whole")
    crashed = subprocess.run(
        sft_command(killed, sft_file, STEPS, kill_at=3)("", 1, 0),
        cwd=ROOT,
        env=environment(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert crashed.returncode == -9, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert not (killed / "hf").exists()
    assert [step for step, _ in losses(killed)] == [1, 2, 3]  # step 3 was logged, never checkpointed
    log = run_processes(sft_command(killed, sft_file, STEPS), 1, tmp_path, "rerun")[0]
    assert "resumed from" in log and f"FINISHED {STEPS}" not in log.split("resumed from")[0]
    assert [step for step, _ in losses(killed)] == list(range(1, STEPS + 1))  # each step once
    np.testing.assert_allclose([v for _, v in losses(killed)], [v for _, v in losses(whole)], rtol=1e-6)
    for a, b in zip(exported(killed), exported(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def test_sft_as_two_processes_trains_like_one(tmp_path):
    sft_file = _write_file(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    run_processes(sft_command(one, sft_file, 2), 1, tmp_path, "one")
    logs = run_processes(sft_command(two, sft_file, 2), 2, tmp_path, "two")
    assert all("FINISHED 0 2" in log for log in logs)
    assert "step 2/2" in logs[0] and "step 2/2" not in logs[1]  # process 0 logs
    assert len(list((two / "tb").glob("events.out.tfevents.*"))) == 1
    first, second = losses(one), losses(two)
    assert [s for s, _ in second] == [1, 2] and second[0] == first[0]  # the same params and batch
    np.testing.assert_allclose([v for _, v in second], [v for _, v in first], rtol=1e-5)
    for a, b in zip(exported(two), exported(one)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5)
