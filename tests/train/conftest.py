"""Shared fixtures of the trainer tests: the tiny model, and a persistent compilation cache
so that repeated compiles of the same step are cheap."""

import dataclasses

import jax
import pytest

from pyvision_jax.models import ModelConfig, init_params
from tests.train.compilation_cache import COMPILATION_CACHE
from tests.train.scripted_runs import colour_tasks
from tests.train.trajectories import make_trajectory

jax.config.update("jax_compilation_cache_dir", COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    """The tiny preset cut to one decoder layer and two vision blocks (one full-attention):
    every code path of the model, at the smallest compile cost."""
    base = ModelConfig.preset("tiny")
    vision = dataclasses.replace(base.vision, depth=2, fullatt_block_indexes=(1,))
    return dataclasses.replace(base, num_hidden_layers=1, vision=vision)


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
    return init_params(tiny_config, seed=0)


@pytest.fixture(scope="session")
def trajectories(tiny_config):
    return [
        make_trajectory(tiny_config, seed, prompt=8 + 3 * seed, generated=10 + 4 * seed, images=1 + seed % 2)
        for seed in range(4)
    ]


@pytest.fixture(scope="session")
def tasks(tmp_path_factory):
    """Three one-colour image tasks (answers A, B, A) of the scripted training runs."""
    return colour_tasks(tmp_path_factory.mktemp("tasks"))
