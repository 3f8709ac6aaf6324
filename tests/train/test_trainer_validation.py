"""Validation during training through the trainer in the three rollout modes (a scripted
engine and a fake sandbox pool): data.val_files evaluated before training and every 2 steps
into WORKDIR/validation/step_N with TensorBoard scalars of those steps, each once; a rerun
of a finished run validates nothing again."""

import json
import threading

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.data.tasks import write_tasks_jsonl
from pyvision_jax.rollout.producer import GroupProducer, ProducerConfig
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.rollout.sources import FleetSource
from pyvision_jax.rollout.weights import WeightsPublisher, WeightsWatcher
from pyvision_jax.rollout.worker import RolloutWorker, WorkerConfig
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.wiring import build_trainer
from tests.agent.fake_sandbox import FakePool
from tests.train.scripted_runs import answers_by_rollout, small_config
from tests.train.tensorboard_events import read_scalars


class CountingEngine(ScriptedEngine):
    """The scripted engine, recording the weights version of every validation request."""

    def __init__(self, tokenizer, script):
        super().__init__(tokenizer, script)
        self.versions = []

    def generate(self, requests, params):
        self.versions.extend(self.version for _ in requests)
        return super().generate(requests, params)


def validated_config(tmp_path, tasks, steps, mode):
    write_tasks_jsonl(tmp_path / "val.jsonl", tasks)
    config = small_config(steps)
    config.rollout.mode = mode
    config.data.val_files = (str(tmp_path / "val.jsonl"),)
    config.eval.every_steps = 2
    config.eval.before_training = True
    config.eval.val_k = 2
    config.eval.val_max_tool_calls = 3
    config.train.keep_checkpoints = 5
    return config


def train(config, workdir, model, tokenizer, tasks, validation_engine, source=None):
    return build_trainer(
        config,
        workdir,
        model=model,
        tokenizer=tokenizer,
        engine=ScriptedEngine(tokenizer, answers_by_rollout),
        sandboxes=FakePool(),
        tasks=tasks,
        source=source,
        progress=False,
        log=lambda line: None,
        validation_engine=validation_engine,
    ).run()


def assert_validated_once(workdir, steps):
    scalars = read_scalars(str(workdir / "tb" / tags.VALIDATION_TB_DIR))
    for tag in (tags.VAL_ACCURACY, tags.val_accuracy_tag("test"), tags.VAL_TOOL_CALLS, tags.VAL_RESPONSE_LENGTH):
        assert [step for step, _ in scalars[tag]] == steps, tag
    # rollouts 0 answer right on tasks 0 and 2 (answer A), rollouts 1 on task 1 (B): half right
    assert all(value == 0.5 for _, value in scalars[tags.VAL_ACCURACY])
    assert all(value == 1.0 for _, value in scalars[tags.val_end_reason_tag("DONE")])
    for step in steps:
        results = json.loads((workdir / "validation" / f"step_{step}" / "results.json").read_text())
        assert results["complete"] and results["policy_version"] == step and results["settings"]["k"] == 2
        assert results["settings"]["temperature"] == 0.0 and results["settings"]["max_tool_calls"] == 3
        assert (workdir / "validation" / f"step_{step}" / "report.html").is_file()
    assert tags.VAL_ACCURACY not in read_scalars(str(workdir / "tb")), "validation scalars stay in tb/validation"


def test_sync_run_validates_before_training_and_every_two_steps_once(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    config = validated_config(tmp_path, tasks, 4, "sync")
    engine = CountingEngine(tokenizer, answers_by_rollout)
    summary = train(config, tmp_path / "run", (tiny_config, tiny_params), tokenizer, tasks, engine)
    assert summary.last_step == 4
    assert_validated_once(tmp_path / "run", [0, 2, 4])
    assert sorted(set(engine.versions)) == [0, 2, 4] and len(engine.versions) == 3 * 3 * 2
    # the checkpoint of a validation step is on disk before it validates (train.checkpoint_every 3)
    assert {2, 4} <= set(TrainCheckpoints(tmp_path / "run" / "checkpoints", 3, 10).all_steps())
    rerun = CountingEngine(tokenizer, answers_by_rollout)
    train(config, tmp_path / "run", (tiny_config, tiny_params), tokenizer, tasks, rerun)
    assert rerun.versions == []
    assert_validated_once(tmp_path / "run", [0, 2, 4])


def test_async_run_validates_at_the_same_steps(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    config = validated_config(tmp_path, tasks, 2, "async")
    config.rollout.max_staleness = 1
    config.rollout.max_backlog = 2
    engine = CountingEngine(tokenizer, answers_by_rollout)
    summary = train(config, tmp_path / "run", (tiny_config, tiny_params), tokenizer, tasks, engine)
    assert summary.last_step == 2
    assert_validated_once(tmp_path / "run", [0, 2])


def test_external_run_validates_in_the_trainer(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    config = validated_config(tmp_path, tasks, 2, "external")
    queue = LocalTrajectoryQueue(max_backlog=2, max_staleness=0)
    publisher = WeightsPublisher(tmp_path / "weights", tiny_config, queue=queue)
    source = FleetSource(queue, publisher, DeliveredGroups(None, "test"), publish_every=1, wait_timeout_s=120)
    fleet_engine = ScriptedEngine(tokenizer, answers_by_rollout)
    producer = GroupProducer(
        ProducerConfig(group_size=2),
        engine=fleet_engine,
        tokenizer=tokenizer,
        sandboxes=FakePool(),
        episode=EpisodeConfig(max_new_tokens_per_turn=32, max_total_tokens=1024, image_max_pixels=56 * 56 * 4),
    )
    worker = RolloutWorker(
        WorkerConfig(max_staleness=0, poll_s=0.02),
        tasks=tasks,
        producer=producer,
        queue=queue,
        weights=WeightsWatcher(queue, fleet_engine),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    engine = CountingEngine(tokenizer, answers_by_rollout)
    try:
        summary = train(config, tmp_path / "run", (tiny_config, tiny_params), tokenizer, tasks, engine, source)
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert summary.last_step == 2
    assert_validated_once(tmp_path / "run", [0, 2])
    assert sorted(set(engine.versions)) == [0, 2]
