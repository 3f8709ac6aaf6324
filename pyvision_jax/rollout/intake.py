"""The trainer's side of a trajectory queue: take groups, never lose or double-train one.

Queue entries are acknowledged as soon as they are taken, so the queue's bounded backlog
(which counts unacknowledged entries) never waits on the trainer's checkpoints. What makes
that safe is the spool: with a spool directory, each group is first written there (one file,
fsynced, renamed into place), and the file is deleted only when the checkpoint of the step
that trained it is on disk (`acknowledge(receipt)`). A trainer killed at any point finds the
groups of its lost steps in the spool when it restarts and trains them first (`replay`).

Repeats of a group (a restarted worker puts one twice) are dropped by key and counted; group
keys become permanent in the dedup only with the acknowledgement, so a group whose step was
lost is admitted again.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.rollout.queue import DeliveredGroups, TrajectoryQueue

SPOOL_SUFFIX = ".group"


@dataclasses.dataclass(frozen=True)
class Receipt:
    """What was taken since the previous receipt: spool files and group keys, released for
    good once the steps that trained them are checkpointed."""

    files: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    def to_json(self) -> dict[str, list[str]]:
        return {"files": list(self.files), "keys": list(self.keys)}

    @classmethod
    def from_json(cls, data: dict[str, list[str]] | None) -> "Receipt":
        data = data or {}
        return cls(tuple(data.get("files", ())), tuple(data.get("keys", ())))


class SpoolWriteError(RuntimeError):
    """A group could not be spooled (the message names the path and the cause)."""


class GroupSpool:
    """Groups received but not yet covered by a checkpoint, one file each, in arrival order."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for partial in self.directory.glob(".*.partial"):
            partial.unlink()
        names = sorted(p.name for p in self.directory.glob(f"*{SPOOL_SUFFIX}"))
        self._next = int(names[-1].split(".")[0]) + 1 if names else 0

    def files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SPOOL_SUFFIX}"))

    def write(self, payload: bytes) -> str:
        name = f"{self._next:012d}{SPOOL_SUFFIX}"
        self._next += 1
        partial = self.directory / f".{name}.partial"
        try:
            with open(partial, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(partial, self.directory / name)
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise SpoolWriteError(f"{self.directory / name} not written: {error.strerror or error}") from error
        return name

    def remove(self, names: tuple[str, ...]) -> None:
        for name in names:
            (self.directory / name).unlink(missing_ok=True)


class QueueIntake:
    """Takes groups from a queue for the trainer (see the module docstring). `refresh` runs on
    every poll (re-asserting the trainer's version and weights after a Redis restart); `check`
    raises a producer's error."""

    def __init__(
        self,
        queue: TrajectoryQueue,
        timeout_s: float,
        *,
        dedup: DeliveredGroups | None = None,
        spool: GroupSpool | None = None,
        refresh: Callable[[], None] = lambda: None,
        check: Callable[[], None] = lambda: None,
    ):
        self.queue, self.timeout_s, self.dedup, self.spool = queue, timeout_s, dedup, spool
        self.refresh, self.check = refresh, check
        self.duplicates_dropped = 0
        self.replay_dropped = 0
        self._replay: list[tuple[str, TrajectoryGroup]] = []
        self._files: list[str] = []
        self._keys: list[str] = []
        self._outstanding: dict[str, str] = {}  # key -> spool file of groups taken, not yet acknowledged

    def outstanding(self) -> Receipt:
        """Every group taken and not yet acknowledged. A checkpoint stores this: the groups it
        lists were trained by the checkpointed steps, so a restart from that checkpoint
        releases them (`acknowledge`) before `load_spool`, even when the run was killed between
        the checkpoint's commit and its acknowledgement."""
        return Receipt(tuple(name for name in self._outstanding.values() if name), tuple(self._outstanding))

    def load_spool(self, trainer_version: int) -> int:
        """Queues the spooled groups (of steps a killed run lost) to be taken first, so the
        resumed run trains what the lost steps did; they passed the staleness check when they
        arrived, so it is not applied again. A group from weights newer than `trainer_version`
        (discarded by the restart) is dropped and counted. Returns how many will be replayed."""
        if self.spool is None:
            return 0
        for path in self.spool.files():
            group = TrajectoryGroup.from_bytes(path.read_bytes())
            admitted = self.dedup is None or self.dedup.admit(group)
            if group.policy_version > trainer_version or not admitted:
                self.replay_dropped += 1
                path.unlink()
                continue
            self._replay.append((path.name, group))
        return len(self._replay)

    def _accept(self, name: str, group: TrajectoryGroup, taken: list[TrajectoryGroup]) -> None:
        self._files.append(name)
        self._keys.append(group.key)
        self._outstanding[group.key] = name
        taken.append(group)

    def take(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        """Up to `count` groups, waiting at most `timeout_s` in all; fewer only when `stop` is set."""
        taken: list[TrajectoryGroup] = []
        while self._replay and len(taken) < count:
            self._accept(*self._replay.pop(0), taken)
        deadline = time.monotonic() + self.timeout_s
        while len(taken) < count:
            self.check()
            if stop.is_set():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no trajectory groups for {self.timeout_s} s (rollout.wait_timeout_s); "
                    f"are the rollout workers running?"
                )
            self.refresh()
            for item in self.queue.get(max_groups=count - len(taken), timeout=1.0):
                group = TrajectoryGroup.from_bytes(item.payload)
                if self.dedup is not None and not self.dedup.admit(group):
                    self.duplicates_dropped += 1
                else:
                    self._accept(self.spool.write(item.payload) if self.spool else "", group, taken)
                self.queue.ack([item.id])
        return taken

    def receipt(self) -> Receipt:
        receipt = Receipt(tuple(name for name in self._files if name), tuple(self._keys))
        self._files, self._keys = [], []
        return receipt

    def acknowledge(self, receipt: Receipt) -> None:
        """Releases the groups of `receipt` for good (idempotent): their keys become permanent
        in the dedup and their spool files go."""
        for key in receipt.keys:
            self._outstanding.pop(key, None)
        if self.dedup is not None:
            self.dedup.commit(list(receipt.keys))
        if self.spool is not None:
            self.spool.remove(receipt.files)

    def stats(self) -> dict[str, float]:
        stats = self.queue.stats()
        return {
            "duplicates_dropped": float(self.duplicates_dropped),
            "stale_dropped": float(stats.dropped_stale_total),
            "future_dropped": float(stats.dropped_future_total + self.replay_dropped),
            "backlog": float(stats.backlog),
        }
