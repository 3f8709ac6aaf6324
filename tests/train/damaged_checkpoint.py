"""A child process for the damaged-checkpoint tests, so that each restore runs in a fresh
interpreter with no command's hooks installed (what orbax's stray reports would print goes to
this process's own stderr):

    python -m tests.train.damaged_checkpoint make WORKDIR     # steps 1 and 2 of a tiny model
    python -m tests.train.damaged_checkpoint restore WORKDIR  # the trainer's fallback
    python -m tests.train.damaged_checkpoint policy WORKDIR   # the evaluation's fallback

`restore` and `policy` print each warning on stderr and "restored STEP" on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer
from pyvision_jax.wiring.evaluation import load_policy
from tests.tiny_random_cpu import get_config as tiny_cpu_config


def tiny_config():
    config = tiny_cpu_config()
    config.model.hf_dir, config.model.preset = "", "tiny"
    return config


def train_state():
    """A tiny model's train state of random values (cheaper than the eager init)."""
    rng = np.random.default_rng(1)
    shapes = jax.eval_shape(lambda: init_params(ModelConfig.preset("tiny")))
    params = jax.tree.map(lambda a: (0.05 * rng.standard_normal(a.shape)).astype(a.dtype), shapes)
    return init_train_state(params, make_optimizer(OptimizerConfig()), 0)


def main(mode: str, workdir: Path) -> None:
    if mode == "make":
        workdir.mkdir(parents=True)
        (workdir / "config.json").write_text(tiny_config().to_json_best_effort())
        checkpoints = TrainCheckpoints(workdir / "checkpoints", every=1, keep=5)
        state = train_state()
        for step in (1, 2):
            checkpoints.save(step, state, {"step": step}, force=True)
        checkpoints.close()
    elif mode == "restore":
        checkpoints = TrainCheckpoints(workdir / "checkpoints", every=1, keep=5)
        template = jax.eval_shape(train_state)
        step, _, _ = checkpoints.restore_intact(template, warn=lambda line: print(line, file=sys.stderr))
        checkpoints.close()
        print(f"restored {step}", flush=True)
    elif mode == "policy":
        policy = load_policy(workdir, tiny_config(), progress=False)
        for line in policy.skipped:
            print(line, file=sys.stderr)
        print(f"restored {policy.version}", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
