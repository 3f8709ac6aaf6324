"""Fixtures for the rollout tests: a real redis-server started for the session."""

import importlib.util

import pytest
import redis

from tests.rollout.redis_server import RedisServer

# The vLLM engine tests belong to the fleet environment (.venv-vllm), where scripts/test.sh
# runs them (and fails if none is collected); an environment without vllm leaves them out.
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["test_vllm_engine.py", "test_vllm_export.py", "test_fleet_environment.py"]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server on a free loopback port for the whole session, stopped at the end."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """The session server's URL, with an empty database for each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url
