"""Samplers: the in-process JAX engine and vLLM (built only on request: the main .venv has
no vllm; the fleet environment .venv-vllm, `scripts/install_fleet.sh`, does), with the
directory vLLM loads a checkpoint from."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.agent.engine import Engine
from pyvision_jax.models import ModelConfig
from pyvision_jax.models.vision import max_image_tokens
from pyvision_jax.rollout.jax_engine import JaxEngine
from pyvision_jax.rollout.vllm_engine import write_preprocessor_config
from pyvision_jax.wiring.config_values import int_tuple

logger = logging.getLogger(__name__)

PREPROCESSOR_CONFIG = "preprocessor_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
)


def jax_engine(
    config: ml_collections.ConfigDict,
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    *,
    version: int,
    max_total_tokens: int,
    eos_token_ids: Iterable[int] | None = None,
) -> Engine:
    """The in-process JAX sampler with the config's rollout shapes, its KV cache long enough
    for `max_total_tokens`; `eos_token_ids` end a sequence (None: the tokenizer's end-of-turn
    ids; () generates to the token limit, as benchmarks do). Blocks with images are sized for
    one `episode.image_max_pixels` image per row from the start (so that their vision shapes do
    not creep up, each step compiling another); with `rollout.warm_up` it compiles every shape
    it can dispatch first."""
    r = config.rollout
    image_tokens = max_image_tokens(model.vision, config.episode.image_max_pixels)
    batch_sizes = int_tuple(r.batch_sizes, "rollout.batch_sizes")
    if batch_sizes:  # capped at max_batch, which is always one of them (a smaller max_batch overrides)
        if min(batch_sizes) < 1:
            raise ValueError(f"rollout.batch_sizes must be positive row counts, got {batch_sizes}")
        batch_sizes = tuple(sorted({min(b, r.max_batch) for b in batch_sizes} | {r.max_batch}))
    engine = JaxEngine(
        model,
        params,
        tokenizer,
        max_batch=r.max_batch,
        prefill_batch_sizes=batch_sizes or None,
        length_buckets=int_tuple(r.length_buckets, "rollout.length_buckets"),
        decode_chunk=r.decode_chunk,
        kv_continuation=bool(r.kv_continuation),
        live_span=bool(r.live_span),
        min_cache_length=int(max_total_tokens),
        compute_dtype=config.model.compute_dtype,
        version=version,
        eos_token_ids=eos_token_ids,
        image_tokens_per_row=image_tokens,
    )
    if r.warm_up:
        done = engine.warm_up()
        logger.info("JAX engine warm-up: %d executables compiled in %.1f s", done.compiles, done.seconds)
    return engine


def require_vllm() -> None:
    """Raises a clear error when the `vllm` package is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            "rollout.engine='vllm' needs the vllm package, which this Python environment "
            "lacks: run with the fleet environment (.venv-vllm/bin/python; built by "
            "`bash scripts/install_fleet.sh cuda` on GPU nodes, `bash scripts/install_fleet.sh cpu` "
            "elsewhere), or use --config.rollout.engine=jax"
        )


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def vllm_model_dir(
    source: str | os.PathLike,
    target: str | os.PathLike,
    model: ModelConfig,
    tokenizer_source: str | os.PathLike,
    *,
    min_pixels: int,
    max_pixels: int,
    weight_files: Sequence[Path] = (),
) -> Path:
    """A directory vLLM can load: `source` itself when it has a preprocessor config and a
    tokenizer and no `weight_files` live elsewhere, else `target` with `source`'s files and
    `weight_files` (hard links, or copies across file systems, so a pruned published version
    stays readable), the tokenizer files of `tokenizer_source` and a written
    preprocessor_config.json."""
    source, target = Path(source), Path(target)
    elsewhere = [Path(f) for f in weight_files if Path(f).parent != source]
    if (source / PREPROCESSOR_CONFIG).is_file() and (source / "tokenizer_config.json").is_file() and not elsewhere:
        return source
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for entry in [*source.iterdir(), *elsewhere]:
        if entry.is_file():
            _link_or_copy(entry, target / entry.name)
    for name in TOKENIZER_FILES:
        if not (target / name).exists() and (Path(tokenizer_source) / name).is_file():
            shutil.copy2(Path(tokenizer_source) / name, target / name)
    if not (target / PREPROCESSOR_CONFIG).is_file():
        write_preprocessor_config(target, model, min_pixels=min_pixels, max_pixels=max_pixels)
    return target


def vllm_engine(
    config: ml_collections.ConfigDict,
    model_dir: str | os.PathLike,
    *,
    version: int,
    max_total_tokens: int,
    eos_token_ids: Iterable[int] | None = None,
) -> Engine:
    """A `VllmEngine` on `model_dir` with the fleet's sizing: `rollout.max_batch` sequences in
    flight (vLLM's max_num_seqs), a KV cache of `rollout.vllm_kv_cache_mb` (0: vLLM sizes it
    from `rollout.vllm_gpu_memory_utilization` of the GPU), `rollout.vllm_enforce_eager`;
    `eos_token_ids` as in `jax_engine`."""
    require_vllm()
    from pyvision_jax.rollout.vllm_engine import VllmEngine

    r = config.rollout
    kv_mb = int(r.vllm_kv_cache_mb)
    options: dict[str, Any] = {"enforce_eager": True} if r.vllm_enforce_eager else {}
    if not kv_mb:
        options["gpu_memory_utilization"] = float(r.vllm_gpu_memory_utilization)
    return VllmEngine(
        model_dir,
        version=version,
        dtype=config.model.compute_dtype,
        max_model_len=int(max_total_tokens),
        max_num_seqs=int(r.max_batch),
        max_images_per_prompt=int(config.episode.max_images) + 1,
        kv_cache_memory_bytes=kv_mb << 20 if kv_mb else None,
        seed=int(config.seed),
        eos_token_ids=eos_token_ids,
        llm_kwargs=options,
    )
