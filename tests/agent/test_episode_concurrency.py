"""No per-turn barrier: a slow sandbox in one trajectory does not hold back the others."""

import pytest

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner
from pyvision_jax.agent.trajectory import EndReason
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from tests.agent.fake_sandbox import FakePool
from tests.agent.turns import answer_turn, code_turn


def _task(task_id, image_task):
    return Task(
        id=task_id,
        question=image_task.question,
        answer="A",
        answer_type="multiple_choice",
        data_source="test",
        image_path=image_task.image_path,
        options=image_task.options,
    )


def test_slow_sandbox_does_not_delay_other_trajectories(tokenizer, image_task):
    pool = FakePool()
    fast_finished = pool.event("fast-finished")
    turns_seen = {}

    def on_generate(requests):
        for request in requests:
            turns_seen[request.request_id] = turns_seen.get(request.request_id, 0) + 1
            pool.log(f"generate:{request.request_id}:turn{turns_seen[request.request_id]}")
        if turns_seen.get("fast/0") == 4:  # the fast trajectory's final (answer) turn
            fast_finished.set()

    script = {
        # the slow trajectory's only run blocks until the fast one has generated 4 turns
        "slow": [code_turn("wait fast-finished"), answer_turn()],
        "fast": [code_turn("print 1"), code_turn("print 2"), code_turn("print 3"), answer_turn()],
    }
    engine = ScriptedEngine(tokenizer, script, on_generate=on_generate)
    runner = EpisodeRunner(engine, tokenizer, pool, EpisodeConfig(max_concurrent=4))
    slow, fast = runner.run_trajectories([(_task("slow", image_task), 0), (_task("fast", image_task), 0)])
    log = pool.events_log
    assert "run-end:fast-finished:released" in log, log
    assert log.index("generate:fast/0:turn4") < log.index("run-end:fast-finished:released")
    # every fast turn after the first was generated while the slow run was still blocked
    for turn in (2, 3, 4):
        assert log.index("run-wait:fast-finished") < log.index(f"generate:fast/0:turn{turn}")
    assert slow.end_reason is EndReason.DONE and fast.end_reason is EndReason.DONE
    assert fast.num_successful_tool_calls == 3 and slow.num_successful_tool_calls == 1
    assert engine.calls[0] == ("slow/0", "fast/0")


def test_ready_trajectories_share_one_generation_batch(tokenizer, image_task):
    tasks = [_task(f"t{i}", image_task) for i in range(4)]
    engine = ScriptedEngine(tokenizer, {t.id: [code_turn(), answer_turn()] for t in tasks})
    pool = FakePool()
    runner = EpisodeRunner(engine, tokenizer, pool, EpisodeConfig(max_concurrent=4))
    trajectories = runner.run_trajectories([(t, 0) for t in tasks])
    assert [t.task_id for t in trajectories] == ["t0", "t1", "t2", "t3"]
    assert sorted(engine.calls[0]) == ["t0/0", "t1/0", "t2/0", "t3/0"]
    assert sum(len(c) for c in engine.calls) == 8


def test_admission_is_limited_to_max_concurrent(tokenizer, image_task):
    tasks = [_task(f"t{i}", image_task) for i in range(5)]
    engine = ScriptedEngine(tokenizer, {t.id: [answer_turn()] for t in tasks})
    runner = EpisodeRunner(engine, tokenizer, FakePool(), EpisodeConfig(max_concurrent=2))
    trajectories = runner.run_trajectories([(t, 0) for t in tasks])
    assert all(len(call) <= 2 for call in engine.calls)
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]


def test_an_engine_failure_propagates_and_returns_every_sandbox(tokenizer, image_task):
    class FailingEngine(ScriptedEngine):
        def generate(self, requests, params):
            if len(self.calls) == 1:
                raise RuntimeError("engine died")
            return super().generate(requests, params)

    tasks = [_task(f"t{i}", image_task) for i in range(3)]
    engine = FailingEngine(tokenizer, {t.id: [code_turn(), answer_turn()] for t in tasks})
    pool = FakePool()
    runner = EpisodeRunner(engine, tokenizer, pool, EpisodeConfig(max_concurrent=3))
    with pytest.raises(RuntimeError, match="engine died"):
        runner.run_trajectories([(t, 0) for t in tasks])
    assert len(pool.acquired) == 3 and sorted(map(id, pool.released)) == sorted(map(id, pool.acquired))
