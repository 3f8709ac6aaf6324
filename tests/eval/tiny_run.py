"""Overrides that make launch/train.py on tests/tiny_random_cpu.py a seconds-long run: the tiny
random-init model, one task per kind, one group of two, eight new tokens a turn; and a
trainer's workdir written directly (config.json and one checkpoint)."""

from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer

TINY = [
    "--config.model.hf_dir=",
    "--config.model.preset=tiny",
    "--config.rl.group_size=2",
    "--config.rl.batch_groups=1",
    "--config.rl.max_gen_rounds=1",
    "--config.episode.max_new_tokens_per_turn=8",
    "--config.data.synthetic_per_kind=1",
    "--config.sandbox.pool_size=1",
    "--config.train.length_buckets=512",
    "--config.rollout.length_buckets=512,1024",
]


def write_training_workdir(workdir: Path, config: ml_collections.ConfigDict, params: Any, step: int) -> Path:
    """A trainer's workdir in miniature: its resolved config.json and one checkpoint of a
    fresh train state holding ``params`` at ``step``."""
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(config.to_json_best_effort())
    manager = TrainCheckpoints(workdir / "checkpoints", every=1, keep=1)
    manager.save(step, init_train_state(params, make_optimizer(OptimizerConfig()), 0), {"step": step}, force=True)
    manager.close()
    return workdir
