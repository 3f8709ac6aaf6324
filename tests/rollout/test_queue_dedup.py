"""The consumer's delivery dedup, in memory and in Redis (server fixture in conftest.py)."""

import pytest
import redis

from pyvision_jax.rollout.queue import DeliveredGroups, QueueConfig
from tests.rollout.minimal_groups import make_group


def test_key_names_task_and_epoch_and_survives_regeneration():
    assert make_group("t0", 0).key == "t0#0"
    assert make_group("t0", 3).key == "t0#3"
    assert make_group("t0", 3).key == make_group("t0", 3).key


def test_in_memory_dedup_admits_each_key_once():
    delivered = DeliveredGroups(None, "run")
    groups = [make_group("t0", 0), make_group("t1", 0), make_group("t0", 1)]
    assert [delivered.admit(g) for g in groups] == [True, True, True]
    assert [delivered.admit(g) for g in groups] == [False, False, False]  # in flight
    delivered.commit([g.key for g in groups])
    assert delivered.admit(make_group("t1", 0)) is False  # a regenerated, already trained group
    assert DeliveredGroups(None, "run").admit(groups[0])  # memory is per object
    delivered.close()


def test_namespace_must_be_given_and_non_empty():
    with pytest.raises(TypeError):
        DeliveredGroups(None)  # the namespace is explicit: no silent default
    with pytest.raises(ValueError, match="namespace"):
        DeliveredGroups(None, "")


def test_uncommitted_keys_are_admitted_again_after_a_restart(redis_url):
    """A trainer killed before its checkpoint trains the same groups again when it resumes."""
    group = make_group("t0", 0)
    killed = DeliveredGroups(redis_url, "run")
    assert killed.admit(group)
    killed.close()  # killed before the step was checkpointed: nothing committed
    resumed = DeliveredGroups(redis_url, "run")
    assert resumed.admit(make_group("t0", 0))
    resumed.commit(["t0#0"])
    other_consumer = DeliveredGroups(redis_url, "run")
    assert not other_consumer.admit(make_group("t0", 0))  # committed keys are shared in Redis
    assert other_consumer.admit(make_group("t0", 1))
    resumed.close()
    other_consumer.close()


def test_committed_keys_expire_after_the_ttl(redis_url):
    delivered = DeliveredGroups(redis_url, "ttl-run", ttl_s=60)
    delivered.commit(["t0#0"])
    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl("ttl-run:delivered") <= 60
    client.close()
    delivered.close()
    with pytest.raises(ValueError, match="ttl"):
        DeliveredGroups(None, "run", ttl_s=0)


def test_two_namespaces_on_one_redis_do_not_see_each_others_keys(redis_url):
    run_a, run_b = DeliveredGroups(redis_url, "run-a"), DeliveredGroups(redis_url, "run-b")
    run_a.commit(["t0#0", "t1#0"])
    assert run_b.admit(make_group("t0", 0))  # the same key in another run is new there
    run_b.commit(["t0#0", "t1#0"])
    assert not run_a.admit(make_group("t0", 0)) and not run_b.admit(make_group("t1", 0))
    client = redis.Redis.from_url(redis_url)
    assert sorted(k for k in client.keys() if k.endswith(b":delivered")) == [b"run-a:delivered", b"run-b:delivered"]
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
    delivered.commit(["t0#0"])
    client = redis.Redis.from_url(redis_url)
    assert client.smembers("exp-7:delivered") == {b"t0#0"}
    client.close()
    delivered.close()
    in_memory = DeliveredGroups.for_queue(QueueConfig(backend="local", namespace="exp-7"))
    assert in_memory.admit(make_group("t0", 0))  # not in Redis: the local run starts empty
