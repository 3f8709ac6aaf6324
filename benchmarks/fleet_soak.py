"""The fleet under a schedule of faults, with a ledger of every group at the end.

A trainer in external mode, `--workers` rollout workers (JAX engine, tiny random model, real
sandboxes) and a Redis queue with AOF run for `--minutes` of faults, counted from the first
trained step. Each fault is injected once the fleet has recovered from the previous one:

  worker_kill      kill -9 of a worker mid-episode, restarted at once
  trainer_term     SIGTERM of the trainer (it saves and exits), restarted
  redis_persistent Redis killed and restarted on its append-only file
  redis_volatile   Redis killed and restarted empty, as a server without persistence: each
                   worker puts again the groups it put that the trainer had not taken
  worker_stall     a worker stopped (SIGSTOP) for --stall-s, then continued
  worker_disk_full the disk under a worker's cursor fills: the worker stops with one line,
                   the disk is freed and the worker restarted

At the end the workers are stopped (SIGTERM), the trainer drains the stream and is stopped,
and the ledger is printed (and written to OUT/ledger.json): groups produced (distinct keys
the workers put), trained (taken into a step's batch: trained on, or filtered by the
selection), dropped by the trainer as repeats (a group put again after its worker died
between the put and its cursor write, or put again after a restart without persistence when
the trainer had taken it already), put again after such a restart, in flight at the end (in
the stream or the trainer's spool), lost, trained twice; steps completed; the recovery time
after each fault (to the next trained step, and for a worker fault to that worker's next group).
The exit status is 1 when a group was lost or trained twice or a fault was not recovered from.

    python -m benchmarks.fleet_soak --minutes 10
    python -m benchmarks.fleet_soak --minutes 2 --faults worker_kill,trainer_term,redis_volatile

The disk-full fault mounts a small tmpfs (root); without one it is skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import redis

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data import synthetic

ROOT = Path(__file__).resolve().parents[1]

FAULTS = ("worker_kill", "trainer_term", "redis_persistent", "redis_volatile", "worker_stall", "worker_disk_full")
NAMESPACE = "soak"
PUT_LINE = re.compile(r"worker (\d+)/\d+: put (\S+) version (\d+)")
PUT_AGAIN_LINE = re.compile(r"restarted without its data: putting (\d+) groups again")
RECOVERY_LIMIT_S = 600.0

CONFIG = """
from configs.base import get_config as base_config


def get_config():
    c = base_config()
    c.model.preset, c.model.hf_dir, c.model.tokenizer = "tiny", "", "tiny"
    c.data.train_files = ({tasks!r},)
    c.rl.group_size, c.rl.batch_groups, c.rl.oversample, c.rl.max_gen_rounds = 2, 2, 1.0, 1
    c.episode.max_new_tokens_per_turn = 16
    c.episode.max_tool_calls = 1
    c.episode.max_concurrent = 4
    c.rollout.mode = "external"
    c.rollout.engine = "jax"
    c.rollout.max_batch = 4
    c.rollout.queue = "redis"
    c.rollout.redis_url = {redis_url!r}
    c.rollout.queue_namespace = {namespace!r}
    c.rollout.max_backlog = 4
    c.rollout.max_staleness = 1000
    c.rollout.poll_s = 0.1
    c.rollout.wait_timeout_s = 1800.0
    c.rollout.weights_dir = {weights!r}
    c.rollout.length_buckets = (512, 1024)
    c.train.steps = 1000000
    c.train.checkpoint_every = 1
    c.train.keep_checkpoints = 2
    c.train.micro_batch = 2
    c.train.length_buckets = (1024,)
    c.train.sample_groups_per_step = 64
    c.sandbox.pool_size = 2
    return c
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Redis:
    """redis-server on loopback with an append-only file (fsync always)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory),
            ],
            stdout=open(self.directory / "redis.log", "ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with contextlib.closing(self.client()) as client:
                    client.ping()
                    return
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def wipe(self) -> None:
        """Removes the persisted data: the next start is a server that kept nothing."""
        for path in self.directory.iterdir():
            if path.name != "redis.log":
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def counters(self) -> Counter:
        """The queue's event counters (put, acked, dropped_stale, ...) since the server's data began."""
        with contextlib.closing(self.client()) as client:
            return Counter({key.decode(): int(value) for key, value in client.hgetall(f"{NAMESPACE}:stats").items()})

    def stream_keys(self) -> list[str]:
        with contextlib.closing(self.client()) as client:
            entries = client.xrange(f"{NAMESPACE}:groups")
        return [TrajectoryGroup.from_bytes(fields[b"p"]).key for _, fields in entries if b"p" in fields]

    def kill_counting_ready(self) -> tuple[int, Counter]:
        """Kills the server with its writes paused (nothing is put or taken meanwhile); returns
        how many entries were waiting undelivered in the stream and the event counters."""
        with contextlib.closing(self.client()) as client:
            client.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            length = client.xlen(f"{NAMESPACE}:groups")
            try:
                pending = int(client.xpending(f"{NAMESPACE}:groups", "trainer")["pending"])
            except redis.ResponseError:  # no consumer group yet
                pending = 0
            counters = self.counters()
        self.kill()
        return length - pending, counters


class Fleet:
    """The trainer and worker processes, each appending to its own log under OUT/logs."""

    def __init__(self, out: Path, config: Path, workers: int, disk_worker: Path | None):
        self.out, self.config, self.num_workers = out, config, workers
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.workdir = out / "run"
        self.disk_worker = disk_worker  # the last worker's workdir, on a small tmpfs
        self.trainer: subprocess.Popen | None = None
        self.workers: dict[int, subprocess.Popen] = {}
        self.env = os.environ | {
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT),
            "JAX_COMPILATION_CACHE_DIR": str(out / "jax_cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
        }

    def _launch(self, script: str, args: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / script), f"--config={self.config}", *args],
            cwd=ROOT,
            env=self.env,
            stdout=open(self.logs / log, "ab"),
            stderr=subprocess.STDOUT,
        )

    def worker_dir(self, index: int) -> Path:
        if index == self.num_workers - 1 and self.disk_worker is not None:
            return self.disk_worker
        return self.out / f"worker{index}"

    def start_trainer(self) -> None:
        self.trainer = self._launch("train.py", [f"--workdir={self.workdir}", "--progress=false"], "trainer.log")

    def start_worker(self, index: int) -> None:
        args = [f"--worker-index={index}", f"--num-workers={self.num_workers}", f"--workdir={self.worker_dir(index)}"]
        self.workers[index] = self._launch("rollout_worker.py", args, f"worker{index}.log")

    def worker_log(self, index: int) -> str:
        path = self.logs / f"worker{index}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def puts(self, index: int) -> int:
        return sum(1 for match in PUT_LINE.finditer(self.worker_log(index)) if int(match.group(1)) == index)

    def check_alive(self) -> None:
        """Raises when a process died that no fault stopped."""
        for name, process in [("trainer", self.trainer), *((f"worker{i}", p) for i, p in self.workers.items())]:
            if process is not None and process.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with status {process.returncode}:\n{tail}")


def trained_records(workdir: Path) -> list[tuple[int, str]]:
    """(step, group key) of every group taken into a step's batch (trajectories.jsonl)."""
    path = workdir / "trajectories.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        group = record["group"]
        first = min(t["rollout_index"] for t in group["trajectories"])
        records.append((record["step"], f"{group['task']['id']}#{first // len(group['trajectories'])}"))
    return records


def steps_done(workdir: Path) -> int:
    return max((step for step, _ in trained_records(workdir)), default=0)


def wait_until(predicate: Callable[[], bool], fleet: Fleet, limit_s: float) -> float | None:
    """Seconds until `predicate` held (None: not within `limit_s`); fails when a process died."""
    start = time.monotonic()
    while not predicate():
        fleet.check_alive()
        if time.monotonic() - start > limit_s:
            return None
        time.sleep(0.2)
    return time.monotonic() - start


def next_step(fleet: Fleet, limit_s: float = RECOVERY_LIMIT_S) -> float | None:
    before = steps_done(fleet.workdir)
    return wait_until(lambda: steps_done(fleet.workdir) > before, fleet, limit_s)


def next_put(fleet: Fleet, index: int, limit_s: float = RECOVERY_LIMIT_S) -> float | None:
    before = fleet.puts(index)
    return wait_until(lambda: fleet.puts(index) > before, fleet, limit_s)


def fill(path: Path) -> None:
    """Writes `path` until its file system is full."""
    handle = open(path, "wb")
    try:
        while True:
            handle.write(b"\0" * (1 << 16))
            handle.flush()
    except OSError:
        pass
    with contextlib.suppress(OSError):
        handle.close()


def inject(name: str, fleet: Fleet, queue: Redis, args: argparse.Namespace, notes: dict[str, Any]) -> dict[str, Any]:
    """Injects one fault and measures the recovery; returns its ledger row."""
    row: dict[str, Any] = {"fault": name, "at_step": steps_done(fleet.workdir)}
    victim = 0
    if name == "worker_kill":
        next_put(fleet, victim, 120)  # mid-shard, right after a group: the next ones are in flight
        time.sleep(0.5)
        fleet.workers[victim].send_signal(signal.SIGKILL)
        fleet.workers[victim].wait()
        fleet.start_worker(victim)
        row["worker_next_group_s"] = next_put(fleet, victim)
        row["next_step_s"] = next_step(fleet)
    elif name == "trainer_term":
        fleet.trainer.send_signal(signal.SIGTERM)
        row["trainer_exit"] = fleet.trainer.wait(timeout=300)
        start = time.monotonic()
        fleet.start_trainer()
        waited = next_step(fleet)
        row["next_step_s"] = None if waited is None else time.monotonic() - start
    elif name in ("redis_persistent", "redis_volatile"):
        if name == "redis_volatile":  # what the wipe takes: the undelivered entries and the counters
            ready, counters = queue.kill_counting_ready()
            notes["ready_at_wipes"] = notes.get("ready_at_wipes", 0) + ready
            notes.setdefault("counters_before_wipes", Counter()).update(counters)
            queue.wipe()
        else:
            queue.kill()
        time.sleep(args.outage_s)
        start = time.monotonic()
        queue.start()
        waited = next_step(fleet)
        row["next_step_s"] = None if waited is None else time.monotonic() - start
    elif name == "worker_stall":
        fleet.workers[victim].send_signal(signal.SIGSTOP)
        stalled = next_step(fleet, args.stall_s + RECOVERY_LIMIT_S)  # the others keep it training
        row["steps_during_stall"] = stalled is not None
        remaining = args.stall_s - (stalled or 0)
        if remaining > 0:
            time.sleep(remaining)
        fleet.workers[victim].send_signal(signal.SIGCONT)
        row["worker_next_group_s"] = next_put(fleet, victim)
    elif name == "worker_disk_full":
        victim = fleet.num_workers - 1
        disk = fleet.worker_dir(victim)
        filler = disk / "filler"
        fill(filler)
        status = fleet.workers[victim].wait(timeout=RECOVERY_LIMIT_S)
        lines = [line for line in fleet.worker_log(victim).splitlines() if "error:" in line]
        row["worker_exit"], row["worker_error"] = status, lines[-1] if lines else ""
        filler.unlink()
        fleet.start_worker(victim)
        row["worker_next_group_s"] = next_put(fleet, victim)
    row["worker"] = victim if name.startswith("worker") else None
    row["recovered"] = (
        all(row.get(key, 0) is not None for key in ("next_step_s", "worker_next_group_s"))
        and row.get("trainer_exit", 0) == 0
    )
    return row


def ledger(fleet: Fleet, queue: Redis, rows: list[dict[str, Any]], notes: dict[str, Any]) -> dict[str, Any]:
    puts = Counter(
        match.group(2)
        for index in range(fleet.num_workers)
        for match in PUT_LINE.finditer(fleet.worker_log(index))
        if int(match.group(1)) == index
    )
    trained = Counter(key for _, key in trained_records(fleet.workdir))
    counters = queue.counters() + notes.get("counters_before_wipes", Counter())
    stream = queue.stream_keys()
    in_stream = set(stream)
    spool = fleet.workdir / "inflight"
    spooled = {TrajectoryGroup.from_bytes(p.read_bytes()).key for p in spool.iterdir()} if spool.is_dir() else set()
    wiped = notes.get("ready_at_wipes", 0)
    produced = set(puts)
    lost = sorted(produced - set(trained) - in_stream - spooled)
    twice = sorted(key for key, count in trained.items() if count > 1)
    return {
        "groups_produced": len(produced),
        "groups_trained": len(trained),
        "puts": counters["put"],
        # every put is trained, in the stream or the spool at the end, wiped undelivered by a
        # restart without persistence (and put again), dropped as too old or too new, or
        # dropped by the trainer as a repeat
        "dropped_as_repeats": counters["put"]
        - len(trained)
        - len(stream)
        - len(spooled - set(trained))
        - wiped
        - counters["dropped_stale"]
        - counters["dropped_future"],
        "dropped_stale_or_future": counters["dropped_stale"] + counters["dropped_future"],
        "in_flight_at_end": len((in_stream | spooled) - set(trained)),
        "wiped_undelivered": wiped,
        "put_again_after_restarts": sum(
            int(match.group(1))
            for index in range(fleet.num_workers)
            for match in PUT_AGAIN_LINE.finditer(fleet.worker_log(index))
        ),
        "lost": len(lost),
        "lost_keys": lost,
        "trained_twice": len(twice),
        "trained_twice_keys": twice,
        "trained_not_produced": sorted(set(trained) - produced),
        "steps_completed": steps_done(fleet.workdir),
        "faults": rows,
        "notes": notes.get("text", []),
    }


def print_ledger(result: dict[str, Any]) -> None:
    print("\nledger")
    for key in (
        "groups_produced", "puts", "groups_trained", "dropped_as_repeats", "dropped_stale_or_future",
        "wiped_undelivered", "put_again_after_restarts", "in_flight_at_end", "lost", "trained_twice",
        "steps_completed",
    ):  # fmt: skip
        print(f"  {key:26s} {result[key]}")
    print("faults (recovery: seconds to the next trained step / to the worker's next group)")
    for row in result["faults"]:
        shown = []
        for key, what in (("next_step_s", "step"), ("worker_next_group_s", "worker's group")):
            if key in row:
                shown.append(f"{what} {row[key]:.1f} s" if row[key] is not None else f"{what} never")
        extra = f" ({row['worker_error']})" if row.get("worker_error") else ""
        print(
            f"  {row['fault']:17s} at step {row['at_step']:4d}: {', '.join(s for s in shown if s)}"
            f"{'' if row['recovered'] else '  NOT RECOVERED'}{extra}"
        )
    for note in result["notes"]:
        print(f"  note: {note}")


def mount_small_disk(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="time of the fault schedule")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, in order, from {FAULTS}")
    parser.add_argument("--stall-s", type=float, default=30.0, help="how long worker_stall stops a worker")
    parser.add_argument("--outage-s", type=float, default=3.0, help="how long Redis stays down")
    parser.add_argument("--tasks", type=int, default=16, help="synthetic tasks per kind (counting, visual search)")
    parser.add_argument("--out", default="", help="directory for logs, run and ledger.json (default: a new temp dir)")
    args = parser.parse_args()
    faults = [name for name in args.faults.split(",") if name]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or args.workers < 2:
        parser.error(f"unknown faults {unknown}" if unknown else "--workers must be >= 2")
    out = Path(args.out or tempfile.mkdtemp(prefix="fleet-soak-")).absolute()
    out.mkdir(parents=True, exist_ok=True)
    notes: dict[str, Any] = {"text": []}
    tasks_dir = out / "tasks"
    files = []
    for kind in ("counting", "visual_search"):
        synthetic.GENERATORS[kind](tasks_dir, args.tasks, 7)
        files.append(str(tasks_dir / f"{kind}.jsonl"))
    merged = tasks_dir / "tasks.jsonl"
    merged.write_text("".join(Path(f).read_text() for f in files))
    disk = out / f"worker{args.workers - 1}"
    disk_mounted = "worker_disk_full" in faults and mount_small_disk(disk, "1m")
    if "worker_disk_full" in faults and not disk_mounted:
        faults.remove("worker_disk_full")
        notes["text"].append("worker_disk_full skipped: no tmpfs could be mounted (needs root)")
    queue = Redis(out / "redis")
    config = out / "soak_config.py"
    config.write_text(
        CONFIG.format(tasks=str(merged), redis_url=queue.url, namespace=NAMESPACE, weights=str(out / "weights"))
    )
    fleet = Fleet(out, config, args.workers, disk if disk_mounted else None)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        fleet.start_trainer()
        for index in range(args.workers):
            fleet.start_worker(index)
        first = wait_until(lambda: steps_done(fleet.workdir) >= 1, fleet, 1800)
        if first is None:
            raise RuntimeError("no trained step within 30 minutes")
        print(
            f"first step after {time.monotonic() - started:.0f} s; faults for {args.minutes} min: {faults}", flush=True
        )
        deadline = time.monotonic() + args.minutes * 60
        schedule = 0
        while faults and (schedule < len(faults) or time.monotonic() < deadline):
            name = faults[schedule % len(faults)]
            row = inject(name, fleet, queue, args, notes)
            rows.append(row)
            print(f"  {name}: {json.dumps({k: v for k, v in row.items() if k != 'fault'})}", flush=True)
            schedule += 1
        while time.monotonic() < deadline:  # no faults left to inject: the rest runs clean
            fleet.check_alive()
            time.sleep(1)
        for process in fleet.workers.values():
            process.send_signal(signal.SIGTERM)
        for index, process in fleet.workers.items():
            if process.wait(timeout=600) != 0:
                notes["text"].append(f"worker {index} exited with {process.returncode} at the end")
        drained = wait_until(lambda: not queue.stream_keys(), fleet, 300)
        if drained is None:
            notes["text"].append("the stream was not drained within 300 s")
        time.sleep(5)
        fleet.trainer.send_signal(signal.SIGTERM)
        if fleet.trainer.wait(timeout=600) != 0:
            notes["text"].append(f"the trainer exited with {fleet.trainer.returncode} at the end")
        result = ledger(fleet, queue, rows, notes)
    finally:
        for process in [fleet.trainer, *fleet.workers.values()]:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
        queue.kill()
        if disk_mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    result["wall_s"] = round(time.monotonic() - started)
    result["command"] = " ".join(["python", "-m", "benchmarks.fleet_soak", *sys.argv[1:]])
    (out / "ledger.json").write_text(json.dumps(result, indent=1))
    print_ledger(result)
    print(f"ledger: {out / 'ledger.json'}")
    failed = result["lost"] or result["trained_twice"] or result["dropped_as_repeats"] < 0
    failed = failed or not all(row["recovered"] for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
