"""A training checkpoint as a Hugging Face directory that transformers and vLLM load
(``pyvision-convert flax2hf --src WORKDIR``).

The checkpoint is a GRPO or SFT workdir (its newest readable step), its ``checkpoints/``
directory or one step directory; only the params of the saved train state are read. The
run's resolved config.json above the checkpoints names the model the run started from
(``model.hf_dir``): its config.json (every key), generation config, chat template and other
side files are copied, the run's tokenizer (``model.tokenizer``) beside them, and a
``preprocessor_config.json`` is written from the run's image budgets when the source has none.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_collections

from pyvision_jax.convert import save_hf, side_files
from pyvision_jax.convert.hf import DEFAULT_MAX_SHARD_BYTES
from pyvision_jax.eval import policy as policies
from pyvision_jax.models import ModelConfig
from pyvision_jax.rollout.vllm_engine import write_preprocessor_config
from pyvision_jax.wiring.engines import PREPROCESSOR_CONFIG, TOKENIZER_FILES
from pyvision_jax.wiring.model import hf_dir, model_config, tokenizer_dir

_NOT_CARRIED_SUFFIXES = (".bin", ".pt", ".pth", ".msgpack", ".h5", ".index.json")
"""Weights of other formats (and their indexes) in the source directory: never copied."""


@dataclass(frozen=True)
class TrainingExport:
    """Where an exported training checkpoint went and what it was made of."""

    out_dir: Path
    step_dir: Path
    step: int
    source: Path | None
    """The HF directory the run started from (model.hf_dir), None for a random init."""


def _run_config(resolved: dict[str, Any] | None, path: str | os.PathLike) -> ml_collections.ConfigDict:
    if resolved is None:
        raise FileNotFoundError(
            f"{path}: no run config.json above the checkpoint (the trainer writes WORKDIR/config.json "
            f"beside WORKDIR/checkpoints/); export a run's workdir, its checkpoints/ or one step of it"
        )
    return ml_collections.ConfigDict(resolved)


def _side_files(run: ml_collections.ConfigDict, model: ModelConfig, scratch: Path) -> list[Path]:
    """The source model's side files, the run's tokenizer files over them, and a written
    preprocessor config when neither has one."""
    files: dict[str, Path] = {}
    if run.model.hf_dir:
        files |= {p.name: p for p in side_files(hf_dir(run)) if not p.name.endswith(_NOT_CARRIED_SUFFIXES)}
    tokenizer = tokenizer_dir(run)
    files |= {name: tokenizer / name for name in TOKENIZER_FILES if (tokenizer / name).is_file()}
    if PREPROCESSOR_CONFIG not in files:
        e = run.episode
        files[PREPROCESSOR_CONFIG] = write_preprocessor_config(
            scratch, model, min_pixels=int(e.image_min_pixels), max_pixels=int(e.image_max_pixels)
        )
    return sorted(files.values())


def export_training_checkpoint(
    path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: Any = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
    progress: bool = True,
) -> TrainingExport:
    """Writes the params of the training checkpoint at ``path`` as an HF directory at
    ``out_dir`` (safetensors shards of at most ``max_shard_bytes``, cast to ``dtype``; None
    keeps the stored dtype)."""
    if policies.detect_checkpoint_kind(path) != "train":
        raise ValueError(f"{path} is not a training checkpoint (a workdir, its checkpoints/ or one step)")
    loaded = policies.load_policy(path, lambda resolved: model_config(_run_config(resolved, path)), progress=progress)
    run = _run_config(policies.run_config(loaded.path), path)
    source = Path(hf_dir(run)) if run.model.hf_dir else None
    with tempfile.TemporaryDirectory(prefix=".export-files-") as scratch:
        written = save_hf(
            loaded.model_config,
            loaded.params,
            out_dir,
            max_shard_bytes=max_shard_bytes,
            dtype=dtype,
            overwrite=overwrite,
            extra_files=_side_files(run, loaded.model_config, Path(scratch)),
            progress=progress,
            config_from=source,
        )
    return TrainingExport(written, Path(loaded.path), loaded.version, source)


__all__ = ["TrainingExport", "export_training_checkpoint"]
