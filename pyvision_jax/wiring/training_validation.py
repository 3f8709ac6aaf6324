"""Validation during training from a config (`eval.training_validation`): the tasks of
`data.val_files`, evaluated every `eval.every_steps` steps (and at step 0 with
`eval.before_training`) with `eval.val_k` rollouts at `eval.val_temperature`, with
`eval.val_max_tool_calls` tool calls (0: `eval.max_tool_calls`).

Each validation runs in the trainer's process on the trainer's current params, whatever
`rollout.mode` is (sync, async or external: the rollouts of training are not involved),
through a JAX sampler built for it and released after it (`eval.val_max_batch` slots, else
`rollout.max_batch`), with a sandbox pool of its own, under the evaluation budgets
(`eval.max_tool_calls`, `eval.max_new_tokens_per_turn`, `eval.max_total_tokens`) and the
run's scoring routes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.agent.engine import Engine
from pyvision_jax.eval.policy import LoadedPolicy
from pyvision_jax.eval.training_validation import TrainingValidation, ValidationSchedule
from pyvision_jax.models import ModelConfig
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.evaluation import evaluate_policy, jax_engine
from pyvision_jax.wiring.tasks import task_file


def validation_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with the validation's own sampling and engine in the places evaluation reads."""
    out = ml_collections.ConfigDict(config.to_dict())
    out.eval.temperature = float(config.eval.val_temperature)
    out.rollout.engine = "jax"
    if int(config.eval.val_max_batch) > 0:
        out.rollout.max_batch = int(config.eval.val_max_batch)
    return out


def validation_schedule(config: ml_collections.ConfigDict) -> ValidationSchedule:
    return ValidationSchedule(
        every_steps=int(config.eval.every_steps),
        before_training=bool(config.eval.before_training),
        last_step=int(config.train.steps),
    )


def training_validation(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    model: ModelConfig,
    tokenizer: Any,
    *,
    engine: Engine | None = None,
    sandboxes: Any = None,
) -> TrainingValidation | None:
    """The run's validation (None when `data.val_files` is empty). `engine` (tests: a
    scripted engine) replaces the JAX sampler and takes each validation's params through
    `update_weights`; `sandboxes` replaces the pool."""
    files = str_tuple(config.data.val_files, "data.val_files")
    if not files:
        return None
    if int(config.eval.val_k) < 1 or float(config.eval.val_temperature) < 0 or int(config.eval.val_max_tool_calls) < 0:
        raise ValueError(
            f"eval.val_k must be >= 1, eval.val_temperature and eval.val_max_tool_calls >= 0, got "
            f"{config.eval.val_k}, {config.eval.val_temperature} and {config.eval.val_max_tool_calls}"
        )
    if bool(config.train.distributed):
        raise ValueError(
            "data.val_files needs a single-process run (train.distributed is set); evaluate the "
            "checkpoints with launch/eval.py instead"
        )
    schedule = validation_schedule(config)
    tasks = [task for path in files for task in task_file(config, path)]
    repeated = sorted(name for name, count in Counter(t.id for t in tasks).items() if count > 1)
    if repeated:
        raise ValueError(f"data.val_files: task id {repeated[0]!r} appears more than once in {', '.join(files)}")
    settings = validation_config(config)
    workdir = Path(workdir).absolute()

    def engine_for(config: ml_collections.ConfigDict, policy: LoadedPolicy, tokenizer: Any) -> Engine:
        if engine is None:
            return jax_engine(config, policy, tokenizer)
        engine.update_weights(policy.params, policy.version)
        return engine

    def evaluate(params: Any, step: int, out_dir: Path) -> dict[str, Any]:
        policy = LoadedPolicy("params", f"{workdir} (training, step {step})", model, params, step, None)
        return evaluate_policy(
            settings,
            policy,
            tasks,
            ", ".join(str(Path(path).absolute()) for path in files),
            out_dir,
            k=int(config.eval.val_k),
            max_tool_calls=int(config.eval.val_max_tool_calls) or None,
            progress=False,
            engine_factory=engine_for,
            sandboxes=sandboxes,
            tokenizer=tokenizer,
        )

    return TrainingValidation(workdir, schedule, evaluate)
