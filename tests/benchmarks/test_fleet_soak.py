"""`python -m benchmarks.fleet_soak` in its short form: a trainer, two JAX rollout workers and Redis for
two minutes of faults (a worker killed mid-episode, the trainer stopped and restarted, Redis
restarted empty as a server without persistence, whose groups the workers put again). The
script's own ledger decides: it exits 0 only when no group was lost or trained twice and every
fault was recovered from; the test also checks the ledger's figures add up."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_short_soak_loses_no_group_and_trains_none_twice(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.fleet_soak",
            "--minutes=2",
            "--faults=worker_kill,trainer_term,redis_volatile",
            f"--out={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert [row["fault"] for row in ledger["faults"]][:3] == ["worker_kill", "trainer_term", "redis_volatile"]
    assert all(row["recovered"] for row in ledger["faults"])
    assert ledger["lost"] == 0 and ledger["trained_twice"] == 0 and ledger["trained_not_produced"] == []
    assert ledger["steps_completed"] >= 2 and ledger["groups_trained"] >= 4
    assert ledger["puts"] >= ledger["groups_produced"] >= ledger["groups_trained"]
    assert ledger["dropped_as_repeats"] >= 0  # every put is accounted for
    # every entry a restart without persistence wiped undelivered was put again by its worker
    # (which may also put again groups the trainer took but it had not yet seen taken)
    assert ledger["put_again_after_restarts"] >= ledger["wiped_undelivered"]
    assert ledger["dropped_stale_or_future"] == 0  # the trainer's version survives the restarts
    assert "ledger" in done.stdout and "groups_produced" in done.stdout
