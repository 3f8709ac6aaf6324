"""The consumer's delivery dedup, in memory and in Redis (server fixture in conftest.py)."""

import pytest
import redis

from pyvision_jax.agent.trajectory import EndReason, Trajectory, TrajectoryGroup
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.queue import DeliveredGroups, QueueConfig

GROUP_SIZE = 2


def make_group(task_id: str, epoch: int) -> TrajectoryGroup:
    """A group of `task_id` whose rollout indices are those of `epoch`."""
    task = Task(id=task_id, question="q", answer="a", answer_type="text", data_source="test",
                image_path="image.png")
    trajectories = tuple(
        Trajectory(task_id=task_id, rollout_index=epoch * GROUP_SIZE + k, token_ids=[1, 2],
                   loss_mask=[0, 1], logprobs=[0.0, -0.5], prompt_length=1, images=(), turns=(),
                   num_tool_calls=0, num_successful_tool_calls=0, end_reason=EndReason.DONE,
                   broken=False, final_answer="a", policy_version=0)
        for k in range(GROUP_SIZE)
    )
    return TrajectoryGroup(task, trajectories)


def test_key_names_task_and_epoch_and_survives_regeneration():
    assert make_group("t0", 0).key == "t0#0"
    assert make_group("t0", 3).key == "t0#3"
    assert make_group("t0", 3).key == make_group("t0", 3).key


def test_in_memory_dedup_admits_each_key_once():
    delivered = DeliveredGroups(None, "run")
    groups = [make_group("t0", 0), make_group("t1", 0), make_group("t0", 1)]
    assert [delivered.first(g) for g in groups] == [True, True, True]
    assert [delivered.first(g) for g in groups] == [False, False, False]
    assert delivered.first(make_group("t1", 0)) is False  # a regenerated group: same key
    assert DeliveredGroups(None, "run").first(groups[0])  # memory is per object
    delivered.close()


def test_namespace_must_be_given_and_non_empty():
    with pytest.raises(TypeError):
        DeliveredGroups(None)  # the namespace is explicit: no silent default
    with pytest.raises(ValueError, match="namespace"):
        DeliveredGroups(None, "")


def test_redis_dedup_is_shared_by_consumers_and_survives_a_restart(redis_url):
    group = make_group("t0", 0)
    first, other_consumer = DeliveredGroups(redis_url, "run"), DeliveredGroups(redis_url, "run")
    assert first.first(group)
    assert not other_consumer.first(group)
    first.close()
    restarted = DeliveredGroups(redis_url, "run")
    assert not restarted.first(make_group("t0", 0))
    assert restarted.first(make_group("t0", 1))
    other_consumer.close()
    restarted.close()


def test_two_namespaces_on_one_redis_do_not_see_each_others_keys(redis_url):
    group = make_group("t0", 0)
    run_a, run_b = DeliveredGroups(redis_url, "run-a"), DeliveredGroups(redis_url, "run-b")
    assert run_a.first(group)
    assert run_b.first(group)  # the same key in another run is new there
    assert not run_a.first(group) and not run_b.first(group)
    assert run_b.first(make_group("t1", 0))
    assert run_a.first(make_group("t1", 0))

    client = redis.Redis.from_url(redis_url)
    assert sorted(client.keys()) == [b"run-a:delivered", b"run-b:delivered"]
    assert client.smembers("run-a:delivered") == {b"t0#0", b"t1#0"}
    assert client.smembers("run-b:delivered") == {b"t0#0", b"t1#0"}
    assert (run_a.redis_key, run_b.redis_key) == ("run-a:delivered", "run-b:delivered")
    client.close()
    run_a.close()
    run_b.close()


def test_for_queue_follows_the_queue_backend_and_namespace(redis_url):
    config = QueueConfig(backend="redis", redis_url=redis_url, namespace="exp-7")
    delivered = DeliveredGroups.for_queue(config)
    assert delivered.namespace == "exp-7"
    assert delivered.first(make_group("t0", 0))
    client = redis.Redis.from_url(redis_url)
    assert client.keys() == [b"exp-7:delivered"]
    client.close()
    delivered.close()

    in_memory = DeliveredGroups.for_queue(QueueConfig(backend="local", namespace="exp-7"))
    assert in_memory.first(make_group("t0", 0))  # not in Redis: the local run starts empty
    client = redis.Redis.from_url(redis_url)
    assert client.smembers("exp-7:delivered") == {b"t0#0"}
    client.close()
