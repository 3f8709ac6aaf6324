"""The three ways scored groups reach the trainer (implementations of `train.source.GroupSource`).

- `SyncSource`: generate then train (on-policy, the paper's setting). `collect(n)` draws the
  next n tasks of the seeded order and runs the `GroupProducer` on them in the caller's
  thread; `publish` loads the new params into the engine.
- `BackgroundSource`: a `RolloutWorker` loop in a thread generates ahead into a local queue
  that admits groups at most `max_staleness` versions old; `publish` hands params to the
  thread through a `WeightsInbox` (loaded between batches).
- `FleetSource`: external rollout workers (`launch/rollout_worker.py`) fill a queue (Redis);
  `publish` exports versioned HF safetensors every `publish_every` steps and announces them
  on the queue; groups a restarted worker delivers twice are dropped by key.

All three hand out groups scored by their producer; none scores or selects.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.rollout.producer import GroupProducer
from pyvision_jax.rollout.queue import DeliveredGroups, TrajectoryQueue
from pyvision_jax.rollout.weights import WeightsInbox, WeightsPublisher
from pyvision_jax.rollout.worker import RolloutWorker

TASKS_DRAWN = "tasks_drawn"
Closer = Callable[[], None]


def _close_all(closers: Sequence[Closer]) -> None:
    for close in reversed(closers):
        close()


def take_groups(queue: TrajectoryQueue, count: int, stop: threading.Event, timeout_s: float,
                accept: Callable[[TrajectoryGroup], bool] = lambda group: True,
                check: Callable[[], None] = lambda: None) -> list[TrajectoryGroup]:
    """Up to `count` groups from `queue` (acked as received), waiting at most `timeout_s` in all;
    fewer only when `stop` is set. `accept` filters (dedup); `check` raises a producer's error."""
    taken: list[TrajectoryGroup] = []
    deadline = time.monotonic() + timeout_s
    while len(taken) < count:
        check()
        if stop.is_set():
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no trajectory groups for {timeout_s} s (rollout.wait_timeout_s); "
                               f"are the rollout workers running?")
        items = queue.get(max_groups=count - len(taken), timeout=1.0)
        queue.ack([item.id for item in items])
        groups = [TrajectoryGroup.from_bytes(item.payload) for item in items]
        taken.extend(group for group in groups if accept(group))
    return taken


class SyncSource:
    """In-process, in the trainer's thread: the next tasks of the order, generated on demand."""

    holds_params = True

    def __init__(self, producer: GroupProducer, shard: TaskShard, closers: Sequence[Closer] = ()):
        self.producer, self.shard = producer, shard
        self.cursor = 0
        self._closers = tuple(closers)

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        self.cursor = int(state.get(TASKS_DRAWN, 0))
        self.producer.engine.update_weights(params, version)

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        items = self.shard.take(self.cursor, count)
        self.cursor += count
        return self.producer.produce(items)

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        self.producer.engine.update_weights(params, version)

    def state(self) -> dict[str, Any]:
        return {TASKS_DRAWN: self.cursor}

    def close(self) -> None:
        _close_all(self._closers)


class BackgroundSource:
    """In-process, a rollout thread running ahead into a local queue."""

    holds_params = True

    def __init__(self, worker: RolloutWorker, inbox: WeightsInbox, queue: TrajectoryQueue, wait_timeout_s: float,
                 closers: Sequence[Closer] = ()):
        self.worker, self.inbox, self.queue = worker, inbox, queue
        self.wait_timeout_s = wait_timeout_s
        self.taken = 0
        self.error: BaseException | None = None
        self._closers = tuple(closers)
        self._thread: threading.Thread | None = None

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        self.taken = int(state.get(TASKS_DRAWN, 0))
        self.queue.set_trainer_version(version)
        self.worker.producer.engine.update_weights(params, version)
        self._thread = threading.Thread(target=self._run, args=(self.taken,), name="rollout-worker", daemon=True)
        self._thread.start()

    def _run(self, cursor: int) -> None:
        try:
            self.worker.run(start=cursor)
        except BaseException as error:  # surfaced to the trainer by collect()
            self.error = error

    @property
    def alive(self) -> bool:
        """Whether the rollout thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError("the rollout thread failed") from self.error

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        groups = take_groups(self.queue, count, stop, self.wait_timeout_s, check=self._check)
        self.taken += len(groups)
        return groups

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        self.queue.set_trainer_version(version)
        self.inbox.offer(params, version)

    def state(self) -> dict[str, Any]:
        return {TASKS_DRAWN: self.taken}

    def close(self) -> None:
        self.worker.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=600)
        _close_all(self._closers)


class FleetSource:
    """External workers over a queue; weights exported to a shared directory."""

    holds_params = False

    def __init__(self, queue: TrajectoryQueue, publisher: WeightsPublisher, delivered: DeliveredGroups, *,
                 publish_every: int, wait_timeout_s: float, closers: Sequence[Closer] = ()):
        if publish_every < 1:
            raise ValueError(f"rollout.publish_every must be >= 1, got {publish_every}")
        self.queue, self.publisher, self.delivered = queue, publisher, delivered
        self.publish_every, self.wait_timeout_s = publish_every, wait_timeout_s
        self._closers = tuple(closers)

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        self.queue.set_trainer_version(version)
        self.publisher.publish(version, jax.device_get(params))

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        return take_groups(self.queue, count, stop, self.wait_timeout_s, accept=self.delivered.first)

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        self.queue.set_trainer_version(version)
        if final or version % self.publish_every == 0:
            self.publisher.publish(version, jax.device_get(params))

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        _close_all(self._closers)
