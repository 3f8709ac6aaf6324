"""The training jobs from a config: GRPO (`build_trainer`, `train`) and SFT (`train_sft`),
each given its typed settings and the objects it runs on."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import jax
import ml_collections

from pyvision_jax.agent.engine import Engine
from pyvision_jax.agent.runner import SandboxSource
from pyvision_jax.data.tasks import Task
from pyvision_jax.models import ModelConfig
from pyvision_jax.train.run_harness import TrainSummary
from pyvision_jax.train.sft import train_sft as run_sft
from pyvision_jax.train.sft_data import SftSamples, load_sft_samples, synthetic_sft_file
from pyvision_jax.train.sft_render import SftRenderer
from pyvision_jax.train.source import GroupSource
from pyvision_jax.train.trainer import Trainer
from pyvision_jax.wiring.config_values import int_tuple, str_tuple
from pyvision_jax.wiring.episodes import episode_config, sandbox_pool
from pyvision_jax.wiring.model import load_model, load_tokenizer, model_config, param_shapes
from pyvision_jax.wiring.rollouts import group_source
from pyvision_jax.wiring.settings import grpo_settings, sft_settings, synthetic_sft_settings
from pyvision_jax.wiring.training_validation import training_validation


def build_trainer(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    model: tuple[ModelConfig, Any] | None = None,
    tokenizer: Any = None,
    engine: Engine | None = None,
    sandboxes: SandboxSource | None = None,
    tasks: Sequence[Task] | None = None,
    source: GroupSource | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    validation_engine: Engine | None = None,
) -> Trainer:
    """The GRPO `Trainer` of `config` in `workdir`. `model` ((ModelConfig, initial params))
    and `tokenizer` replace what the config would build; `engine`, `sandboxes` and `tasks` go
    to `group_source` (tests pass a scripted engine or a fake sandbox pool); `source`
    replaces the config's source whole. With `data.val_files` the trainer validates during
    training (`wiring.training_validation`; `validation_engine` and `sandboxes` replace its
    sampler and pool)."""
    settings = grpo_settings(config)
    settings.run.distributed.initialize()  # before any other JAX call of this process
    workdir = Path(workdir).absolute()
    tokenizer = tokenizer or load_tokenizer(config)
    if model is not None:
        architecture, given = model
        shapes = jax.eval_shape(lambda: given)

        def load_params(sharding: Any) -> Any:
            return jax.device_put(given, sharding)
    else:
        architecture = model_config(config)
        shapes = param_shapes(config, architecture)

        def load_params(sharding: Any) -> Any:
            return load_model(config, sharding=sharding)[1]

    def build_source(params: Any) -> GroupSource:
        return source or group_source(
            config, workdir, architecture, params, tokenizer, engine=engine, sandboxes=sandboxes, tasks=tasks
        )

    return Trainer(
        settings,
        workdir,
        model=architecture,
        tokenizer=tokenizer,
        param_shapes=shapes,
        load_params=load_params,
        build_source=build_source,
        progress=progress,
        log=log,
        validator=training_validation(
            config, workdir, architecture, tokenizer, engine=validation_engine, sandboxes=sandboxes
        ),
    )


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs: Any) -> TrainSummary:
    """Runs (or resumes) GRPO training; see `build_trainer`."""
    return build_trainer(config, workdir, **kwargs).run()


def sft_samples(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    model: ModelConfig,
    tokenizer: Any,
    log: Callable[[str], None] = print,
) -> SftSamples:
    """Every sample of `sft.train_files` (or, when empty, of the synthetic SFT file made on
    first use under WORKDIR/sft_data), rendered as the RL episode renders turns."""
    episode = episode_config(config, model)
    files = str_tuple(config.sft.train_files, "sft.train_files")
    if not files:
        files = (
            str(
                synthetic_sft_file(
                    synthetic_sft_settings(config),
                    workdir,
                    tokenizer=tokenizer,
                    sandboxes=lambda: sandbox_pool(config),
                    episode=episode,
                    log=log,
                )
            ),
        )
    longest = max(int_tuple(config.train.length_buckets, "train.length_buckets"))
    return load_sft_samples(files, SftRenderer(tokenizer, episode), longest)


def train_sft(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> TrainSummary:
    """Runs (or resumes) the SFT stage of `config` in `workdir` (`train.sft`)."""
    settings = sft_settings(config, workdir)
    settings.run.distributed.initialize()  # before any other JAX call of this process
    tokenizer = load_tokenizer(config)
    model, params = load_model(config)
    return run_sft(
        settings,
        workdir,
        model=model,
        params=params,
        load_samples=lambda write: sft_samples(config, workdir, model, tokenizer, write),
        progress=progress,
        log=log,
    )
