"""The three ways scored groups reach the trainer (implementations of `train.source.GroupSource`).

- `SyncSource`: generate then train (on-policy, the paper's setting). `collect(n)` draws the
  next n tasks of the seeded order and runs the `GroupProducer` on them in the caller's
  thread; `publish` loads the new params into the engine.
- `BackgroundSource`: a `RolloutWorker` loop in a thread generates ahead into a local queue
  that admits groups at most `max_staleness` versions old; `publish` hands params to the
  thread through a `WeightsInbox` (loaded between batches).
- `FleetSource`: external rollout workers (`launch/rollout_worker.py`) fill a queue (Redis);
  `publish` snapshots the params every `publish_every` steps and returns; a background thread
  exports the snapshot (bf16, trainable groups, the frozen tower once; `rollout.weights.publisher`) and
  announces it on the queue; groups a restarted worker delivers twice are dropped by key.

Version accounting. The queue judges staleness against the newest weights delivered to the
generators, never against the trainer's step: the fleet's reference moves when an export is
complete and announced, the thread's when it has loaded the offered params. A group made
with the newest weights its producer could have is never stale, however many steps ran
(`publish_every`) or however long the export and reload took; the updates between its
weights and the trained params are the trainer's `version/staleness_*` metrics, corrected
by truncated importance sampling (`rl.importance_sampling`).

The fleet's groups are spooled to disk until the step that trained them is checkpointed
(`receipt` / `acknowledge`, see `rollout.intake`), so a trainer killed mid-step loses nothing.

All three hand out groups scored by their producer; none scores or selects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyvision_jax.agent.runner import Abandoned
from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.rollout.intake import GroupSpool, QueueIntake, Receipt
from pyvision_jax.rollout.producer import GroupProducer
from pyvision_jax.rollout.queue import DeliveredGroups, TrajectoryQueue
from pyvision_jax.rollout.weights.background import BackgroundPublisher, snapshot
from pyvision_jax.rollout.weights.in_process import WeightsInbox
from pyvision_jax.rollout.weights.publisher import WeightsPublisher
from pyvision_jax.rollout.worker import RolloutWorker

TASKS_DRAWN = "tasks_drawn"
UNACKNOWLEDGED = "unacknowledged_groups"
Closer = Callable[[], None]


def _close_all(closers: Sequence[Closer]) -> None:
    for close in reversed(closers):
        close()


class SyncSource:
    """In-process, in the trainer's thread: the next tasks of the order, generated on demand."""

    holds_params = True

    def __init__(self, producer: GroupProducer, shard: TaskShard, closers: Sequence[Closer] = ()):
        self.producer, self.shard = producer, shard
        self.cursor = 0
        self.abandoned_rounds = 0
        self._closers = tuple(closers)

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        self.cursor = int(state.get(TASKS_DRAWN, 0))
        self.producer.engine.update_weights(params, version)

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        """The next `count` tasks' groups; none when `stop` is set first (the round is
        abandoned and its tasks are drawn again by the resumed run, which restores the
        cursor of the last checkpoint)."""
        items = self.shard.take(self.cursor, count)
        try:
            groups = self.producer.produce(items, stop)
        except Abandoned:
            self.abandoned_rounds += 1
            return []
        self.cursor += count
        return groups

    def wants_params(self, version: int, *, final: bool = False) -> bool:
        return True

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        self.producer.engine.update_weights(params, version)

    def state(self) -> dict[str, Any]:
        return {TASKS_DRAWN: self.cursor}

    def receipt(self) -> Receipt:
        return Receipt()

    def acknowledge(self, receipt: Receipt) -> None:
        """Nothing to acknowledge: the groups never left this process."""

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        _close_all(self._closers)


class QueueBackedSource:
    """What the queue-backed sources share: receipts, acknowledgements and counters are the
    intake's."""

    intake: QueueIntake

    def receipt(self) -> Receipt:
        return self.intake.receipt()

    def acknowledge(self, receipt: Receipt) -> None:
        self.intake.acknowledge(receipt)

    def stats(self) -> dict[str, float]:
        return self.intake.stats()


class BackgroundSource(QueueBackedSource):
    """In-process, a rollout thread running ahead into a local queue."""

    holds_params = True

    def __init__(
        self,
        worker: RolloutWorker,
        inbox: WeightsInbox,
        queue: TrajectoryQueue,
        wait_timeout_s: float,
        closers: Sequence[Closer] = (),
    ):
        self.worker, self.inbox, self.queue = worker, inbox, queue
        self.intake = QueueIntake(queue, wait_timeout_s, check=self._check)  # regenerated from the cursor
        self.taken = 0
        self.error: BaseException | None = None
        self._closers = tuple(closers)
        self._thread: threading.Thread | None = None

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        """The inbox moves the queue's version on from here each time the thread loads
        an offer (see `wiring.group_source`)."""
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
        groups = self.intake.take(count, stop)
        self.taken += len(groups)
        return groups

    def wants_params(self, version: int, *, final: bool = False) -> bool:
        return True

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        self.inbox.offer(params, version)

    def state(self) -> dict[str, Any]:
        return {TASKS_DRAWN: self.taken}

    def close(self) -> None:
        self.worker.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=600)
        _close_all(self._closers)


class FleetSource(QueueBackedSource):
    """External workers over a queue; weights exported to a shared directory off the
    trainer's thread. The queue's version is that of the newest announced weights. Every poll
    re-asserts it and the announcement, so a Redis server restarted without persistence is
    repopulated."""

    holds_params = False

    def __init__(
        self,
        queue: TrajectoryQueue,
        publisher: WeightsPublisher,
        delivered: DeliveredGroups,
        *,
        publish_every: int,
        wait_timeout_s: float,
        spool: GroupSpool | None = None,
        closers: Sequence[Closer] = (),
    ):
        if publish_every < 1:
            raise ValueError(f"rollout.publish_every must be >= 1, got {publish_every}")
        self.queue, self.publisher = queue, publisher
        self.publish_every = publish_every
        self.intake = QueueIntake(queue, wait_timeout_s, dedup=delivered, spool=spool, refresh=self._refresh)
        self.published = 0
        self._announced: tuple[int, str] | None = None
        self._closers = tuple(closers)
        self.sync = BackgroundPublisher(publisher, on_published=self._on_published)
        self._frozen_sent = False

    def _submit(self, version: int, params: Any) -> None:
        """Hands a snapshot to the publisher thread (the frozen groups only the first time)."""
        frozen = self.publisher.frozen_groups if self._frozen_sent else ()
        self.sync.submit(version, snapshot(params, [g for g in params if g not in frozen], self.publisher.dtype))
        self._frozen_sent = True

    def _on_published(self, version: int, path: Any) -> None:
        self._announced = (version, str(path))
        self.published = version
        self.queue.set_trainer_version(version)

    def _refresh(self) -> None:
        if self.queue.trainer_version() != self.published:
            self.queue.set_trainer_version(self.published)
        latest = self.queue.latest_weights()
        if self._announced is not None and (latest is None or latest.version != self._announced[0]):
            self.queue.publish_weights(*self._announced)

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        self.published = version
        self.queue.set_trainer_version(version)
        self.intake.acknowledge(Receipt.from_json(state.get(UNACKNOWLEDGED)))  # trained by the checkpoint resumed
        self.intake.load_spool(version)
        self._submit(version, params)

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        return self.intake.take(count, stop)

    def wants_params(self, version: int, *, final: bool = False) -> bool:
        return final or version % self.publish_every == 0

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        if self.wants_params(version, final=final):
            self._submit(version, params)
        if final:
            self.sync.flush()

    def state(self) -> dict[str, Any]:
        return {UNACKNOWLEDGED: self.intake.outstanding().to_json()}

    def close(self) -> None:
        try:
            self.sync.close()
        finally:
            _close_all(self._closers)
