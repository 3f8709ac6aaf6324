"""The training loop with a scripted engine and a fake sandbox pool: resuming reproduces the
run that never stopped bit for bit, a step with no informative group still steps, the three
rollout topologies go through the same trainer, and every answer is scored exactly once."""

import threading

import jax
import numpy as np

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.grading import trajectory as grading_trajectory
from pyvision_jax.rollout.producer import GroupProducer, ProducerConfig
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.rollout.sources import FleetSource
from pyvision_jax.rollout.weights import WeightsPublisher, WeightsWatcher, latest_complete
from pyvision_jax.rollout.worker import RolloutWorker, WorkerConfig
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.wiring import build_trainer
from tests.agent.fake_sandbox import FakePool
from tests.train.scripted_runs import always_wrong, answers_by_rollout, run, small_config
from tests.train.tensorboard_events import read_scalars


def test_resume_gives_bit_identical_params(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    straight, trainer_a = run(
        small_config(6), tmp_path / "a", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout
    )
    first, _ = run(small_config(3), tmp_path / "b", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    resumed, trainer_b = run(
        small_config(6), tmp_path / "b", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout
    )
    assert (straight.first_step, straight.last_step) == (0, 6)
    assert (first.last_step, resumed.first_step, resumed.last_step) == (3, 3, 6)
    a, b = jax.device_get(trainer_a.state), jax.device_get(trainer_b.state)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    changed = [
        not np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(tiny_params["model"]), jax.tree.leaves(a.params["model"]))
    ]
    assert all(changed), "training must have changed the decoder"
    scalars = read_scalars(str(tmp_path / "a" / "tb"))
    assert [s for s, _ in scalars[tags.FILTER_GROUPS_KEPT]] == [1, 2, 3, 4, 5, 6]
    assert all(v == 1.0 for _, v in scalars[tags.FILTER_GROUPS_KEPT])
    assert all(v == 0.5 for _, v in scalars[tags.REWARD_ACCURACY])
    assert TrainCheckpoints(tmp_path / "b" / "checkpoints", 3, 2).all_steps() == [3, 6]


def test_kl_to_the_starting_model_is_logged_and_a_resumed_run_measures_it_against_the_same_model(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    def kl_config(steps):
        config = small_config(steps)
        config.rl.kl_coef = 0.2
        return config

    run(kl_config(4), tmp_path / "a", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    run(kl_config(2), tmp_path / "b", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    _, resumed = run(kl_config(4), tmp_path / "b", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    straight = read_scalars(str(tmp_path / "a" / "tb"))[tags.ACTOR_REF_KL]
    again = read_scalars(str(tmp_path / "b" / "tb"))[tags.ACTOR_REF_KL]
    assert [s for s, _ in straight] == [1, 2, 3, 4] and straight[0][1] < 1e-6  # step 1 trains the start itself
    assert all(v > 0 for _, v in straight[1:])
    np.testing.assert_allclose([v for _, v in again], [v for _, v in straight], rtol=1e-5, atol=1e-9)
    assert resumed.reference is not None and set(resumed.reference) == {"model", "lm_head"}


def test_uniform_updates_parameters_are_logged_as_their_mean_every_step(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    config = small_config(2)
    config.train.uniform_updates = ("model/norm/scale",)
    config.train.lr = 0.05
    _, trainer = run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    curve = read_scalars(str(tmp_path / "tb"))[tags.param_mean_tag("model/norm/scale")]
    assert [s for s, _ in curve] == [1, 2]
    final = np.asarray(jax.device_get(trainer.state.params["model"]["norm"]["scale"]))
    np.testing.assert_allclose(curve[-1][1], final.mean(), rtol=1e-6)
    start = float(np.asarray(tiny_params["model"]["norm"]["scale"]).mean())
    assert abs(curve[-1][1] - start) > 1e-3  # the logged mean moved with training
    assert np.ptp(final - np.asarray(tiny_params["model"]["norm"]["scale"])) < 1e-5  # by one shared amount


def test_no_informative_group_still_steps_after_max_gen_rounds(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    config = small_config(1)
    config.rl.max_gen_rounds = 3
    summary, trainer = run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, always_wrong)
    assert summary.last_step == 1
    scalars = {k: v[-1][1] for k, v in read_scalars(str(tmp_path / "tb")).items()}
    assert scalars[tags.FILTER_GEN_ROUNDS] == 3 and scalars[tags.FILTER_GROUPS_DRAWN] == 6
    assert scalars[tags.FILTER_GROUPS_KEPT] == 0 and scalars[tags.FILTER_ZERO_VARIANCE_FRAC] == 1.0
    assert scalars[tags.ACTOR_UPDATED] == 0 and scalars[tags.REWARD_TOTAL] == 0
    for x, y in zip(jax.tree.leaves(tiny_params), jax.tree.leaves(jax.device_get(trainer.state.params))):
        assert np.array_equal(x, y)


def test_async_staleness_one_with_truncated_is_trains_and_drops_no_group(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    """Off-policy training end to end: a rollout thread generating during each
    step (max_staleness 1), token-level truncated IS against the proximal policy; the
    thread's groups are one version old or more, and none is dropped for the bookkeeping."""
    config = small_config(3)
    config.rollout.mode = "async"
    config.rollout.max_staleness = 1
    config.rollout.max_backlog = 2
    config.rl.importance_sampling = "token"
    config.rl.is_truncation = 2.0
    summary, trainer = run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    assert summary.last_step == 3 and not summary.interrupted
    assert not trainer.source.alive and trainer.source.error is None
    assert trainer.step_config.loss.importance_sampling == "token" and trainer.step_config.old_logprobs == "current"
    scalars = read_scalars(str(tmp_path / "tb"))
    assert [s for s, _ in scalars[tags.VERSION_STALENESS_MAX]] == [1, 2, 3]
    assert all(v == 0 for _, v in scalars[tags.QUEUE_STALE_DROPPED])
    assert max(v for _, v in scalars[tags.VERSION_STALENESS_MAX]) >= 1, "the thread's groups must be off-policy"
    assert all(v == 1.0 for _, v in scalars[tags.FILTER_GROUPS_KEPT])
    assert all(v == 1.0 for _, v in scalars[tags.ACTOR_UPDATED])
    assert all(v > 0 for _, v in scalars[tags.ACTOR_LOSS_TOKENS])
    # the scripted engine's logprobs are far from the model's: the IS ratio is far from 1
    assert all(v < 0.5 for _, v in scalars[tags.ACTOR_IS_RATIO_MEAN])


def test_external_fleet_trains_through_the_same_trainer(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    """A rollout worker (the fleet's loop, in a thread here) fills a queue and loads the weights
    the trainer publishes; the trainer runs its one code path over a `FleetSource`."""
    config = small_config(2)
    config.rollout.mode = "external"
    queue = LocalTrajectoryQueue(max_backlog=2, max_staleness=0)
    publisher = WeightsPublisher(tmp_path / "weights", tiny_config, queue=queue)
    source = FleetSource(queue, publisher, DeliveredGroups(None, "test"), publish_every=1, wait_timeout_s=120)
    engine = ScriptedEngine(tokenizer, answers_by_rollout)
    producer = GroupProducer(
        ProducerConfig(group_size=2),
        engine=engine,
        tokenizer=tokenizer,
        sandboxes=FakePool(),
        episode=EpisodeConfig(max_new_tokens_per_turn=32, max_total_tokens=1024, image_max_pixels=56 * 56 * 4),
    )
    worker = RolloutWorker(
        WorkerConfig(max_staleness=0, poll_s=0.02),
        tasks=tasks,
        producer=producer,
        queue=queue,
        weights=WeightsWatcher(queue, engine),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        summary = build_trainer(
            config,
            tmp_path / "run",
            model=(tiny_config, tiny_params),
            tokenizer=tokenizer,
            source=source,
            progress=False,
            log=lambda line: None,
        ).run()
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert summary.last_step == 2 and not thread.is_alive()
    assert latest_complete(tmp_path / "weights").version == 2
    scalars = read_scalars(str(tmp_path / "run" / "tb"))
    # the export runs while the next step collects: until it is announced, the previous
    # version's groups are the newest there are (staleness 0 for admission, one update behind)
    assert [s for s, _ in scalars[tags.VERSION_STALENESS_MEAN]] == [1, 2]
    assert all(0 <= v <= 1 for _, v in scalars[tags.VERSION_STALENESS_MEAN])
    assert all(v == 1.0 for _, v in scalars[tags.FILTER_GROUPS_KEPT])


def test_every_answer_is_scored_exactly_once_between_production_and_training(
    tmp_path, monkeypatch, tiny_config, tiny_params, tokenizer, tasks
):
    calls = []
    score_response = grading_trajectory.score_response

    def counting(response, *args, **kwargs):
        calls.append(response)
        return score_response(response, *args, **kwargs)

    monkeypatch.setattr(grading_trajectory, "score_response", counting)
    config = small_config(2)
    config.rl.max_gen_rounds = 2
    summary, _ = run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    assert summary.last_step == 2
    drawn = sum(v for _, v in read_scalars(str(tmp_path / "tb"))[tags.FILTER_GROUPS_DRAWN])
    assert drawn >= 4 and len(calls) == drawn * config.rl.group_size
