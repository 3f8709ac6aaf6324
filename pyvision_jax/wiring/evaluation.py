"""From a config, a checkpoint and a task file to a finished evaluation (``pyvision-eval``).

Config keys read (``configs/tiny_cpu.py`` schema): ``model.*`` (tokenizer, dtypes, and the
architecture of training checkpoints), ``episode.*`` (image budgets, error handling,
concurrency), ``sandbox.*``, ``rollout.*`` (engine kind, JAX engine shapes) and ``eval.*``:
``k``, ``max_tool_calls``, ``max_new_tokens_per_turn``, ``max_total_tokens`` (they replace
the episode budgets), ``seed``, ``temperature``, ``top_p``, ``top_k``, ``tasks_per_batch``
(0: fill ``episode.max_concurrent``), ``report_rollouts_per_task`` (rollouts of each task
in report.html; 0: every one).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import ml_collections

from pyvision_jax.agent.engine import Engine
from pyvision_jax.convert import save_hf
from pyvision_jax.data.tasks import Task
from pyvision_jax.eval import policy as policies
from pyvision_jax.eval.evaluate import EvalSettings, Evaluator
from pyvision_jax.eval.policy import LoadedPolicy
from pyvision_jax.models import ModelConfig
from pyvision_jax.wiring import engines
from pyvision_jax.wiring.episodes import episode_config, sandbox_pool, scorer_routes
from pyvision_jax.wiring.model import hf_dir, load_model, load_tokenizer, model_config, tokenizer_dir
from pyvision_jax.wiring.tasks import task_file

logger = logging.getLogger(__name__)

EngineFactory = Callable[[ml_collections.ConfigDict, LoadedPolicy, Any], Engine]


def eval_settings(config: ml_collections.ConfigDict, k: int | None = None, progress: bool = True) -> EvalSettings:
    v = config.eval
    return EvalSettings(
        k=int(k if k is not None else v.k),
        seed=int(v.seed),
        temperature=float(v.temperature),
        top_p=float(v.top_p),
        top_k=int(v.top_k),
        tasks_per_batch=int(v.tasks_per_batch),
        report_rollouts_per_task=int(v.report_rollouts_per_task),
        progress=progress,
    )


def load_policy(path: str | os.PathLike, config: ml_collections.ConfigDict, progress: bool = True) -> LoadedPolicy:
    """The weights at ``path`` (any checkpoint layout), in ``model.param_dtype``; a training
    checkpoint's architecture comes from its run's resolved config, else from ``config``."""

    def model_for(resolved: dict[str, Any] | None) -> ModelConfig:
        return model_config(ml_collections.ConfigDict(resolved) if resolved is not None else config)

    return policies.load_policy(path, model_for, dtype=config.model.get("param_dtype") or None, progress=progress)


def jax_engine(config: ml_collections.ConfigDict, policy: LoadedPolicy, tokenizer: Any) -> Engine:
    """The in-process JAX sampler with the config's rollout shapes and eval budget."""
    return engines.jax_engine(
        config,
        policy.model_config,
        policy.params,
        tokenizer,
        version=policy.version,
        max_total_tokens=int(config.eval.max_total_tokens),
    )


def vllm_eval_engine(config: ml_collections.ConfigDict, policy: LoadedPolicy, work_dir: Path) -> Engine:
    """vLLM on the policy: an HF checkpoint directory as it is (with a preprocessor config and
    tokenizer added beside links to its files when it lacks them); params and training
    checkpoints are first exported with ``save_hf`` into a temporary directory in ``work_dir``."""
    engines.require_vllm()
    e = config.episode
    work_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".vllm-model-", dir=work_dir))
    source = Path(policy.path)
    if policy.kind != "hf":
        source = save_hf(policy.model_config, policy.params, staging / "export", progress=False)
    model_dir = engines.vllm_model_dir(
        source,
        staging / "model",
        policy.model_config,
        tokenizer_dir(config, policy.tokenizer_dir),
        min_pixels=e.image_min_pixels,
        max_pixels=e.image_max_pixels,
    )
    return engines.vllm_engine(
        config, model_dir, version=policy.version, max_total_tokens=int(config.eval.max_total_tokens)
    )


def build_engine(
    config: ml_collections.ConfigDict, policy: LoadedPolicy, tokenizer: Any, work_dir: str | os.PathLike | None = None
) -> Engine:
    """The engine of ``rollout.engine`` ("jax" or "vllm"; vLLM exports go under ``work_dir``,
    default a new temporary directory)."""
    kind = config.rollout.engine
    if kind == "jax":
        return jax_engine(config, policy, tokenizer)
    if kind == "vllm":
        return vllm_eval_engine(config, policy, Path(work_dir or tempfile.mkdtemp(prefix="pyvision-eval-")))
    raise ValueError(f"rollout.engine={kind!r}: expected 'jax' or 'vllm'")


def config_policy(config: ml_collections.ConfigDict, progress: bool = True) -> LoadedPolicy:
    """The config's own model: model.hf_dir (a packaged checkpoint for "packaged:NAME"), else
    a random init of model.preset (kind "params", path "preset:NAME")."""
    if config.model.hf_dir:
        return load_policy(hf_dir(config), config, progress=progress)
    model, params = load_model(config)
    return LoadedPolicy("params", f"preset:{config.model.preset}", model, params, 0, None)


def evaluate_checkpoint(
    config: ml_collections.ConfigDict,
    checkpoint: str | os.PathLike | None,
    data: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    k: int | None = None,
    max_tool_calls: int | None = None,
    progress: bool = True,
    engine_factory: EngineFactory | None = None,
    sandboxes: Any = None,
) -> dict[str, Any]:
    """Loads the checkpoint (None: the config's own model, `config_policy`) and the tasks,
    runs the evaluation into ``out_dir``; returns the results (also in
    ``out_dir/results.json``). ``sandboxes`` replaces the config's pool."""
    tasks = task_file(config, data)
    policy = (
        config_policy(config, progress) if checkpoint is None else load_policy(checkpoint, config, progress=progress)
    )
    return evaluate_policy(
        config,
        policy,
        tasks,
        str(Path(data).absolute()),
        out_dir,
        k=k,
        max_tool_calls=max_tool_calls,
        progress=progress,
        engine_factory=engine_factory,
        sandboxes=sandboxes,
    )


def evaluate_policy(
    config: ml_collections.ConfigDict,
    policy: LoadedPolicy,
    tasks: Sequence[Task],
    data: str,
    out_dir: str | os.PathLike,
    *,
    k: int | None = None,
    max_tool_calls: int | None = None,
    progress: bool = True,
    engine_factory: EngineFactory | None = None,
    sandboxes: Any = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Evaluates ``policy`` on ``tasks`` (``data`` names where they came from in
    results.json) into ``out_dir``; `evaluate_checkpoint` after loading."""
    tokenizer = tokenizer or load_tokenizer(config, policy.tokenizer_dir)
    engine = (
        engine_factory(config, policy, tokenizer)
        if engine_factory
        else build_engine(config, policy, tokenizer, work_dir=out_dir)
    )
    episode = episode_config(config, policy.model_config, evaluation=True, max_tool_calls=max_tool_calls)
    settings = eval_settings(config, k, progress)
    for line in policy.skipped:
        logger.warning("%s; evaluating step %d instead (%s)", line, policy.version, policy.path)
    run_info = {
        "checkpoint": policy.path,
        "checkpoint_kind": policy.kind,
        "skipped_checkpoints": list(policy.skipped),
        "policy_version": policy.version,
        "data": data,
        "engine_kind": config.rollout.engine,
    }
    own_pool = sandboxes is None
    if own_pool:
        sandboxes = sandbox_pool(config)
    try:
        evaluator = Evaluator(
            engine,
            tokenizer,
            sandboxes,
            episode,
            settings,
            run_info,
            temporal_patch_size=policy.model_config.vision.temporal_patch_size,
            routes=scorer_routes(config),
        )
        return evaluator.run(tasks, out_dir)
    finally:
        if own_pool:
            sandboxes.close()


__all__ = [
    "EngineFactory",
    "build_engine",
    "config_policy",
    "eval_settings",
    "evaluate_checkpoint",
    "evaluate_policy",
    "jax_engine",
    "load_policy",
    "vllm_eval_engine",
]
