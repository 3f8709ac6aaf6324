"""The rollout loop in process: scripted engine, fake sandbox pool, local queue."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.trajectory import GroupScores, TrajectoryGroup
from pyvision_jax.data.task_order import TaskShard
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.producer import GroupProducer, ProducerConfig
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.rollout.scripted_engine import ScriptedEngine, StreamingScriptedEngine
from pyvision_jax.rollout.worker import CursorFile, CursorWriteError, RolloutWorker, WorkerConfig
from pyvision_jax.train.groups import pool_arrays
from tests.agent.fake_sandbox import FakePool
from tests.agent.turns import answer_turn, code_turn

GROUP_SIZE = 4
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tasks")
    out = []
    for i in range(6):
        path = directory / f"t{i}.png"
        Image.new("RGB", (56, 56), (40 * i, 30, 30)).save(path)
        out.append(
            Task(
                id=f"t{i}",
                question="Which colour?",
                answer="A",
                answer_type="multiple_choice",
                data_source="test",
                image_path=str(path),
                options=("red", "blue"),
            )
        )
    return out


def script(request, turn: int) -> str:
    """Even rollouts run one tool call then answer right; odd rollouts answer wrong at once."""
    rollout = int(request.request_id.rsplit("/", 1)[1])
    if rollout % 2:
        return answer_turn("B")
    return code_turn("print looked") if turn == 0 else answer_turn("A")


class VersionedWeights:
    """A stand-in WeightsWatcher: the test sets the announced version, poll() loads it."""

    def __init__(self, engine):
        self.engine = engine
        self.announced = engine.version
        self.lock = threading.Lock()

    def announce(self, version: int) -> None:
        with self.lock:
            self.announced = version

    def poll(self):
        with self.lock:
            if self.announced == self.engine.version:
                return None
            self.engine.update_weights(None, self.announced)
            return self.announced


def make_producer(tokenizer, engine, max_concurrent=8):
    return GroupProducer(
        ProducerConfig(group_size=GROUP_SIZE),
        engine=engine,
        tokenizer=tokenizer,
        sandboxes=FakePool(),
        episode=EpisodeConfig(
            max_new_tokens_per_turn=64,
            max_total_tokens=2048,
            image_max_pixels=56 * 56 * 4,
            max_concurrent=max_concurrent,
        ),
    )


def make_worker(
    tokenizer, tasks, queue, *, index=0, count=1, engine=None, weights=None, cursor=None, max_concurrent=8, **config
):
    engine = engine or ScriptedEngine(tokenizer, script)
    settings = dict(worker_index=index, num_workers=count, poll_s=0.02)
    return RolloutWorker(
        WorkerConfig(**(settings | config)),
        tasks=tasks,
        producer=make_producer(tokenizer, engine, max_concurrent),
        queue=queue,
        weights=weights,
        cursor=cursor,
    )


def drain(queue) -> list[TrajectoryGroup]:
    items = queue.get(max_groups=1000, timeout=0)
    queue.ack([item.id for item in items])
    return [TrajectoryGroup.from_bytes(item.payload) for item in items]


def test_groups_are_scored_and_versioned(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    engine = ScriptedEngine(tokenizer, script, version=3)
    queue.set_trainer_version(3)
    summary = make_worker(tokenizer, tasks, queue, engine=engine).run(max_groups=2)
    groups = drain(queue)
    assert [g.key for g in groups] == [p.key for p in summary.produced]
    for produced, group in zip(summary.produced, groups):
        assert produced.version == group.policy_version == 3
        assert [t.rollout_index for t in group.trajectories] == [0, 1, 2, 3]
        assert group.scores.correct == (True, False, True, False)
        assert group.scores.scores == (1.0, 0.0, 1.0, 0.0)
        assert group.scores.tool_calls == (1, 0, 1, 0)
        np.testing.assert_allclose(produced.rewards, [1.1, 0.0, 1.1, 0.0], rtol=1e-6)
        np.testing.assert_allclose(group.scores.rewards, produced.rewards)
        np.testing.assert_allclose(
            pool_arrays([group], 1, GROUP_SIZE).rewards[0], produced.rewards
        )  # the trainer's view


def test_groups_per_batch_generates_several_groups_in_one_engine_batch(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    batches = []
    engine = ScriptedEngine(tokenizer, script, on_generate=lambda requests: batches.append(len(requests)))
    summary = make_worker(tokenizer, tasks, queue, engine=engine, groups_per_batch=3).run(max_groups=3)
    assert len(summary.produced) == 3 and len(drain(queue)) == 3
    assert batches[0] > GROUP_SIZE  # episodes of several groups share the first engine batch


def test_unscored_group_round_trips_its_scores(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    make_worker(tokenizer, tasks, queue).run(max_groups=1)
    [group] = drain(queue)
    assert isinstance(group.scores, GroupScores)
    assert TrajectoryGroup.from_bytes(group.to_bytes()).scores == group.scores


def test_shards_are_disjoint_complete_and_deterministic(tasks):
    per_worker = [[TaskShard(tasks, 7, i, 4).at(c) for c in range(2 * len(range(i, 6, 4)))] for i in range(4)]
    for epoch in (0, 1):
        ids = [item.task.id for items in per_worker for item in items if item.epoch == epoch]
        assert sorted(ids) == sorted(t.id for t in tasks)
    again = [TaskShard(tasks, 7, 1, 4).at(c).task.id for c in range(4)]
    assert again == [item.task.id for item in per_worker[1]]
    orders = [[TaskShard(tasks, 7, 0, 1).at(c).task.id for c in range(6 * e, 6 * e + 6)] for e in (0, 1)]
    assert orders[0] != orders[1]  # each epoch has its own order


def test_workers_cover_every_prompt_once_and_resume_from_cursor(tokenizer, tasks, tmp_path):
    queue = LocalTrajectoryQueue(max_staleness=None)
    cursors = [CursorFile(tmp_path / f"w{i}.json") for i in range(2)]
    first = make_worker(tokenizer, tasks, queue, index=0, count=2, max_epochs=1, cursor=cursors[0])
    assert len(first.run(max_groups=2).produced) == 2
    assert cursors[0].load() == 2
    resumed = make_worker(tokenizer, tasks, queue, index=0, count=2, max_epochs=1, cursor=cursors[0])
    assert len(resumed.run().produced) == 1  # the rest of its shard of 3, then the epoch ends
    other = make_worker(tokenizer, tasks, queue, index=1, count=2, max_epochs=1, cursor=cursors[1])
    other.run()
    keys = [g.key for g in drain(queue)]
    assert sorted(keys) == sorted(f"{t.id}#0" for t in tasks)


def test_second_epoch_has_new_rollout_indices_and_dedup_drops_repeats(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    make_worker(tokenizer, tasks[:2], queue, max_epochs=2).run()
    groups = drain(queue)
    assert sorted(g.key for g in groups) == ["t0#0", "t0#1", "t1#0", "t1#1"]
    second = [g for g in groups if g.key.endswith("#1")]
    assert all([t.rollout_index for t in g.trajectories] == [4, 5, 6, 7] for g in second)
    delivered = DeliveredGroups(None, "test")
    assert [delivered.admit(g) for g in groups + groups[:1]] == [True] * 4 + [False]


def test_pauses_while_ahead_of_trainer_and_resumes(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    engine = ScriptedEngine(tokenizer, script, version=5)
    queue.set_trainer_version(3)
    worker = make_worker(tokenizer, tasks, queue, engine=engine, max_staleness=1)
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=worker.run(max_groups=1)))
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive()  # 5 - 3 > 1: waiting, nothing produced
    assert queue.stats().put_total == 0
    queue.set_trainer_version(4)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert result["summary"].pauses == 1
    assert [g.policy_version for g in drain(queue)] == [5]


def test_stop_while_paused_puts_nothing(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    worker = make_worker(tokenizer, tasks, queue, engine=ScriptedEngine(tokenizer, script, version=2), max_staleness=0)
    threading.Timer(0.3, worker.request_stop).start()
    summary = worker.run()
    assert summary.stopped and summary.produced == () and queue.stats().put_total == 0


def test_new_weights_are_loaded_between_groups(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    batches = []

    def announce_after_first(requests):
        batches.append(requests)
        if len(batches) == 1:
            queue.set_trainer_version(1)  # the trainer's step, then its weights
            weights.announce(1)  # mid-group: must not change this group's version

    engine = ScriptedEngine(tokenizer, script, version=0, on_generate=announce_after_first)
    weights = VersionedWeights(engine)
    worker = make_worker(tokenizer, tasks, queue, engine=engine, weights=weights)
    summary = worker.run(max_groups=2)
    assert [p.version for p in summary.produced] == [0, 1]
    assert summary.versions_loaded == (1,)
    groups = drain(queue)
    assert [min(turn.policy_version for t in g.trajectories for turn in t.turns) for g in groups] == [0, 1]
    assert all(turn.policy_version == 0 for t in groups[0].trajectories for turn in t.turns)


# ----------------------------------------------------------------------------- streaming


def slow_task(task_id: str, seconds: float):
    """Latency per request: `seconds` for the requests of `task_id`, 10 ms for the others."""
    return lambda request: seconds if request.request_id.startswith(f"{task_id}/") else 0.01


def trajectory_tokens(groups):
    return {g.key: [list(map(int, t.token_ids)) for t in g.trajectories] for g in groups}


def test_streaming_worker_puts_each_group_as_it_ends_and_a_slow_one_holds_back_none(tokenizer, tasks):
    first_task = TaskShard(tasks, 0).at(0).task.id
    engine = StreamingScriptedEngine(tokenizer, script, latency_s=slow_task(first_task, 1.5))
    queue = LocalTrajectoryQueue(max_staleness=None)
    summary = make_worker(tokenizer, tasks, queue, engine=engine, stream=True, max_concurrent=2 * GROUP_SIZE).run(
        max_groups=4
    )
    streamed = drain(queue)
    assert sorted(p.cursor for p in summary.produced) == [0, 1, 2, 3] and summary.cursor == 4
    assert streamed[-1].task.id == first_task  # the others went past it while its turns were slow
    blocking_queue = LocalTrajectoryQueue(max_staleness=None)
    make_worker(tokenizer, tasks, blocking_queue).run(max_groups=4)
    blocking = drain(blocking_queue)
    assert trajectory_tokens(streamed) == trajectory_tokens(blocking)  # the same episodes either way
    assert {g.key: g.scores for g in streamed} == {g.key: g.scores for g in blocking}


class RecordingCursor(CursorFile):
    def __init__(self, path):
        super().__init__(path)
        self.saved = []

    def save(self, cursor: int) -> None:
        self.saved.append(cursor)
        super().save(cursor)


def test_streaming_cursor_is_the_finished_prefix_and_a_restart_redoes_only_what_is_missing(tokenizer, tasks, tmp_path):
    first_task = TaskShard(tasks, 0).at(0).task.id
    engine = StreamingScriptedEngine(tokenizer, script, latency_s=slow_task(first_task, 1.0))
    queue = LocalTrajectoryQueue(max_staleness=None)
    cursor = RecordingCursor(tmp_path / "cursor.json")
    make_worker(
        tokenizer, tasks, queue, engine=engine, stream=True, cursor=cursor, max_concurrent=2 * GROUP_SIZE, max_epochs=1
    ).run()
    assert cursor.saved == [0] * 5 + [6]  # item 0 finished last: until then a crash redoes all
    put = drain(queue)
    assert put[-1].task.id == first_task
    cursor.save(0)  # as if killed just before item 0 was put
    restarted = make_worker(
        tokenizer,
        tasks,
        queue,
        stream=True,
        cursor=cursor,
        engine=StreamingScriptedEngine(tokenizer, script),
        max_epochs=1,
    )
    assert len(restarted.run().produced) == 6
    delivered = DeliveredGroups(None, "stream")
    kept = [g.key for g in put[:-1] + drain(queue) if delivered.admit(g)]
    assert sorted(kept) == sorted(f"{t.id}#0" for t in tasks)  # every task once after dedup


def test_streaming_worker_pauses_admission_while_ahead_of_the_trainer(tokenizer, tasks):
    queue = LocalTrajectoryQueue(max_staleness=None)
    engine = StreamingScriptedEngine(tokenizer, script, version=5)
    queue.set_trainer_version(3)
    worker = make_worker(tokenizer, tasks, queue, engine=engine, stream=True, max_staleness=1)
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=worker.run(max_groups=2)))
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive() and engine.submitted == []  # nothing started at 5 - 3 > 1
    queue.set_trainer_version(4)
    thread.join(timeout=60)
    assert not thread.is_alive() and result["summary"].pauses == 1
    assert [g.policy_version for g in drain(queue)] == [5, 5]


def test_a_cursor_that_cannot_be_written_names_its_file_and_cause_and_keeps_the_last(tmp_path):
    cursor = CursorFile(tmp_path / "worker-0-of-1.json")
    cursor.save(3)
    blocked = CursorFile(tmp_path / "worker-0-of-1.json" / "nested.json")  # its directory is a file
    with pytest.raises(CursorWriteError, match=r"worker cursor .*nested\.json not written \(cursor 4\): "):
        blocked.save(4)
    assert cursor.load() == 3
