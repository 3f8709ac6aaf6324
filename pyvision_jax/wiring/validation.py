"""Everything a run will read, checked before anything expensive is built: every config
section (through the same builders the run uses), every number finite, every input file
(tasks, SFT rows) readable row by row, the episode budget large enough for the prompts, and
an existing workdir trained with the same model. Each problem is one `ConfigError` line that
names the config key, or the file, row and field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ml_collections
from PIL import Image

from pyvision_jax.agent.episode import EpisodeConfig, EpisodeMachine
from pyvision_jax.agent.prompts import ChatRenderer, format_question
from pyvision_jax.agent.sandbox import SandboxConfig
from pyvision_jax.convert.run_layout import CHECKPOINT_DIR, RESOLVED_CONFIG
from pyvision_jax.data.sft_rows import load_sft_rows
from pyvision_jax.data.tasks import Task
from pyvision_jax.eval.policy import checkpoint_tokenizer_dir
from pyvision_jax.models import ModelConfig
from pyvision_jax.processing.image import smart_resize
from pyvision_jax.processing.tokens import num_visual_tokens
from pyvision_jax.wiring.config_values import str_tuple
from pyvision_jax.wiring.engines import require_vllm
from pyvision_jax.wiring.episodes import episode_config, own_judge_prompt, sampling_params, scorer_routes
from pyvision_jax.wiring.heldout import heldout_tasks
from pyvision_jax.wiring.model import load_tokenizer, model_config
from pyvision_jax.wiring.rollouts import MODES, queue_config, worker_tasks
from pyvision_jax.wiring.settings import grpo_settings, heldout_config, sft_settings
from pyvision_jax.wiring.tasks import task_file, training_tasks
from pyvision_jax.wiring.training_validation import validation_schedule

ALGORITHMS = ("grpo", "sft")
WORKER_ENGINES = ("jax", "vllm", "scripted")
EVAL_ENGINES = ("jax", "vllm")
ARCHITECTURE_KEYS = ("model.preset", "model.hf_dir", "model.param_dtype", "train.freeze_vision")
"""Config keys whose change makes a workdir's checkpoints another model's."""


class ConfigError(ValueError):
    """A config value or an input file that cannot work; its message is the one line to show."""


def check_finite(config: ml_collections.ConfigDict) -> None:
    """Every float of the config is a number (no NaN, no infinity)."""
    for key, value in _leaves(config.to_dict()):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--config.{key}={value}: must be a finite number")


def _leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _leaves(value, f"{prefix[:-1]}[{index}].")
    else:
        yield prefix[:-1], tree


def check_same_model(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """A workdir with checkpoints resumes only with the model it was trained with: otherwise
    one line names the differing config keys (and nothing in the workdir is touched)."""
    workdir = Path(workdir)
    resolved = workdir / RESOLVED_CONFIG
    checkpoints = workdir / CHECKPOINT_DIR
    if not resolved.is_file() or not checkpoints.is_dir() or not any(p.name.isdigit() for p in checkpoints.iterdir()):
        return
    try:
        before = ml_collections.ConfigDict(json.loads(resolved.read_text()))
    except ValueError:
        return  # an unreadable record says nothing; the checkpoints' own shapes are checked on restore
    differing = []
    for key in ARCHITECTURE_KEYS:
        section, _, field = key.partition(".")
        old, new = before.get(section, {}).get(field), config[section].get(field)
        if old != new:
            differing.append(f"{key}={new!r} (the workdir's run: {old!r})")
    if differing and _architecture(before) != _architecture(config):
        raise ConfigError(
            f"{workdir} holds checkpoints of another model: {'; '.join(differing)}; use another "
            f"--workdir or the workdir's own config ({resolved})"
        )


def _architecture(config: ml_collections.ConfigDict) -> tuple[Any, ...] | None:
    try:
        model = dataclasses.asdict(model_config(config))
    except (ValueError, OSError, KeyError, AttributeError):
        return None
    model.pop("attention", None)
    model.pop("source", None)
    return model, config.model.get("param_dtype"), bool(config.train.get("freeze_vision", True))


PROMPTS_RENDERED = 4
"""Tasks whose first prompt `check_prompt_fits` renders: those estimated longest."""


def _estimated_prompt_size(task: Task, episode: EpisodeConfig) -> int:
    """The task's visual tokens (from its image's header: no pixels are read; a video's first
    prompt holds no frames) plus its question's bytes (at least its tokens)."""
    size = len(format_question(task).encode())
    if task.is_video:
        return size
    with Image.open(task.image_path) as image:
        width, height = image.size
    height, width = smart_resize(
        height,
        width,
        factor=episode.patch_size * episode.merge_size,
        min_pixels=episode.image_min_pixels,
        max_pixels=episode.image_max_pixels,
    )
    grid = (1, height // episode.patch_size, width // episode.patch_size)
    return size + num_visual_tokens(grid, episode.merge_size)


def _first(pair: tuple[int, Task]) -> int:
    return pair[0]


def check_prompt_fits(
    tasks: Sequence[Task], episode: EpisodeConfig, tokenizer: Any, budget_key: str, kind: str = "task"
) -> None:
    """The longest first prompt leaves room to generate within the episode's total-token
    budget: the prompts of the `PROMPTS_RENDERED` tasks estimated longest (and of the first
    task) are rendered, and the longest of them is checked."""
    if not tasks:
        return
    machine = EpisodeMachine(episode, ChatRenderer(tokenizer, merge_size=episode.merge_size))
    ranked = sorted(tasks, key=lambda task: _estimated_prompt_size(task, episode), reverse=True)
    candidates = {task.id: task for task in (tasks[0], *ranked[:PROMPTS_RENDERED])}.values()
    length, task = max(((len(machine.render_prompt(task).token_ids), task) for task in candidates), key=_first)
    if length >= episode.max_total_tokens:
        raise ConfigError(
            f"{budget_key}={episode.max_total_tokens} cannot hold the prompt of {kind} {task.id!r} "
            f"({length} tokens): raise it above {length}"
        )


def startup_notices(config: ml_collections.ConfigDict) -> list[str]:
    """One line for each released-position config that runs on the project's own texts
    because the user supplied none: the first-prompt templates (under the released
    observation format) and the judge's few-shot prompts (when a route uses the judge)."""
    notices = []
    if config.episode.get("observation_format") == "released":
        for key, default in (("image_prompt_file", "image.txt"), ("video_prompt_file", "video.txt")):
            if not config.episode[key]:
                notices.append(
                    f"notice: --config.episode.{key} is empty: the project's own prompt "
                    f"(configs/prompts/{default}) is used, not the released text"
                )
    judged = any(str(route[-1]) == "judge" for route in config.grading.routes)
    if judged and config.grading.judge_url and own_judge_prompt(config):
        notices.append(
            "notice: no --config.grading.judge_prompt_files: the project's own judge prompt "
            "(configs/prompts/judge.txt) and its Yes/No verdicts are used, not the released few-shot text"
        )
    return notices


def validate_run(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Checks a training run (`algorithm` "grpo" or "sft") before it starts; raises
    `ConfigError` (or the input file's own error, which names the file, row and field)."""
    check_finite(config)
    if config.algorithm not in ALGORITHMS:
        raise ConfigError(f"--config.algorithm={config.algorithm!r} must be one of {ALGORITHMS}")
    check_same_model(config, workdir)
    try:
        model = model_config(config)
        heldout_config(config)
        SandboxConfig(timeout_s=config.sandbox.timeout_s, allow_unisolated=config.sandbox.allow_unisolated)
        episode = episode_config(config, model)
        episode_config(config, model, evaluation=True)
        if config.algorithm == "sft":
            sft_settings(config, workdir)
        else:
            grpo_settings(config)
            if config.rollout.mode not in MODES:
                raise ConfigError(f"--config.rollout.mode={config.rollout.mode!r} must be one of {MODES}")
            sampling_params(config.rollout)
            scorer_routes(config)
            queue_config(config, max_staleness=config.rollout.max_staleness)
            if str_tuple(config.data.val_files, "data.val_files"):
                validation_schedule(config)
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error).splitlines()[0]) from error
    _check_inputs(config, model, episode)


def _check_inputs(config: ml_collections.ConfigDict, model: ModelConfig, episode: EpisodeConfig) -> None:
    if config.algorithm == "sft":
        for path in str_tuple(config.sft.train_files, "sft.train_files"):
            load_sft_rows(path)
        return
    tokenizer = load_tokenizer(config)
    with tempfile.TemporaryDirectory(prefix="pyvision-validation-") as scratch:
        # synthetic tasks are made as the run will make them, here in a scratch directory
        if config.rollout.mode == "external":
            # the workers generate (and check their prompts); the trainer may not see the images
            for path in str_tuple(config.data.train_files, "data.train_files"):
                task_file(config, path)
        else:
            tasks = training_tasks(config, scratch)
            check_prompt_fits(tasks, episode, tokenizer, "--config.episode.max_total_tokens")
        if heldout_config(config).per_kind:
            heldout = task_file(config, heldout_tasks(config, scratch))
            evaluation = episode_config(config, model, evaluation=True)
            check_prompt_fits(heldout, evaluation, tokenizer, "--config.eval.max_total_tokens", "held-out task")
    validation = [
        task for path in str_tuple(config.data.val_files, "data.val_files") for task in task_file(config, path)
    ]
    if validation:
        budget = episode_config(config, model, evaluation=True)
        check_prompt_fits(validation, budget, tokenizer, "--config.eval.max_total_tokens", "validation task")


def validate_evaluation(
    config: ml_collections.ConfigDict, data: str | os.PathLike, checkpoint: str | os.PathLike | None = None
) -> None:
    """Checks an evaluation's config, checkpoint layout and task file before any model loads."""
    check_finite(config)
    if config.rollout.engine not in EVAL_ENGINES:
        raise ConfigError(
            f"--config.rollout.engine={config.rollout.engine!r}: an evaluation runs one of {EVAL_ENGINES}"
        )
    carried = None
    try:
        if checkpoint is not None:
            carried = checkpoint_tokenizer_dir(checkpoint)
        # the checkpoint's own architecture is read when it loads; patch and merge sizes
        # (what the prompt check needs) are those of every Qwen2.5-VL
        model = model_config(config) if checkpoint is None else ModelConfig.preset(config.model.preset)
        episode = episode_config(config, model, evaluation=True)
        sampling_params(config.eval)
        scorer_routes(config)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error).splitlines()[0]) from error
    tasks = list(task_file(config, data))
    check_prompt_fits(tasks, episode, load_tokenizer(config, carried), "--config.eval.max_total_tokens")


def validate_worker(config: ml_collections.ConfigDict, worker_index: int) -> None:
    """Checks a rollout worker's config and its tasks' prompts before it connects to anything."""
    check_finite(config)
    r = config.rollout
    if r.engine not in WORKER_ENGINES:
        raise ConfigError(f"--config.rollout.engine={r.engine!r}: a rollout worker runs one of {WORKER_ENGINES}")
    if r.engine == "scripted" and not r.script_file:
        raise ConfigError("--config.rollout.engine='scripted' needs --config.rollout.script_file")
    if r.engine == "vllm":
        try:
            require_vllm()
        except RuntimeError as error:
            raise ConfigError(str(error).splitlines()[0]) from error
    try:
        episode = episode_config(config, ModelConfig.preset(config.model.preset))
        sampling_params(r)
        scorer_routes(config)
        queue_config(config, max_staleness=r.max_staleness)
        if int(config.rl.group_size) < 1:
            raise ConfigError(f"--config.rl.group_size={config.rl.group_size} must be >= 1")
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error).splitlines()[0]) from error
    with tempfile.TemporaryDirectory(prefix="pyvision-validation-") as scratch:
        tasks = worker_tasks(config, scratch, worker_index)  # synthetic ones as the worker will make them
        check_prompt_fits(tasks, episode, load_tokenizer(config), "--config.episode.max_total_tokens")
