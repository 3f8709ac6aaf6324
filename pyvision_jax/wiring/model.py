"""The `model` section: the checkpoint directory, the tokenizer, the architecture and its
attention kernel, and the initial params."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import jax
import ml_collections
from transformers import AutoTokenizer

from pyvision_jax.convert import load_hf
from pyvision_jax.convert.hf_config import load_model_config
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.processing.tokenizer import TINY_TOKENIZER_DIR, load_tiny_tokenizer

PACKAGED_PREFIX = "packaged:"
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def hf_dir(config: ml_collections.ConfigDict) -> str:
    """model.hf_dir, with "packaged:NAME" resolved to the package's assets/NAME (an HF
    safetensors directory shipped with the package, e.g. "packaged:small_sft")."""
    name = config.model.hf_dir
    if not name.startswith(PACKAGED_PREFIX):
        return name
    path = ASSETS_DIR / name[len(PACKAGED_PREFIX) :]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model.hf_dir={name!r}: no packaged checkpoint at {path}; packaged ones: "
            f"{sorted(p.name for p in ASSETS_DIR.iterdir() if (p / 'config.json').is_file())}"
        )
    return str(path)


def tokenizer_dir(config: ml_collections.ConfigDict, carried: str | os.PathLike | None = None) -> Path:
    """The tokenizer directory: `model.tokenizer` ("tiny": the packaged one unless the
    checkpoint `carried` its own; a directory; "": the checkpoint's, else model.hf_dir)."""
    name = config.model.tokenizer
    if name == "tiny":
        return Path(carried) if carried else TINY_TOKENIZER_DIR
    source = name or carried or hf_dir(config)
    if not source:
        raise ValueError(
            "model.tokenizer is empty and neither the checkpoint nor model.hf_dir has a tokenizer; "
            "set --config.model.tokenizer=DIR (or 'tiny')"
        )
    return Path(source)


def load_tokenizer(config: ml_collections.ConfigDict, carried: str | os.PathLike | None = None) -> Any:
    directory = tokenizer_dir(config, carried)
    return load_tiny_tokenizer() if directory == TINY_TOKENIZER_DIR else AutoTokenizer.from_pretrained(directory)


def attention_config(model: ml_collections.ConfigDict) -> AttentionConfig:
    """From the `model` section: attention, attention_block_q, attention_block_kv."""
    return AttentionConfig(
        implementation=model.attention, block_q=model.attention_block_q, block_kv=model.attention_block_kv
    )


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The architecture of model.hf_dir, else of model.preset, with the model.attention kernel."""
    if config.model.hf_dir:
        model = load_model_config(hf_dir(config))
    else:
        model = ModelConfig.preset(config.model.preset)
    return model.replace(attention=attention_config(config.model))


def param_shapes(config: ml_collections.ConfigDict, model: ModelConfig) -> Any:
    """The params tree of `load_model` as ShapeDtypeStructs (nothing allocated)."""
    return jax.eval_shape(functools.partial(init_params, model, config.seed, config.model.param_dtype))


def load_model(config: ml_collections.ConfigDict, sharding: Any = None) -> tuple[ModelConfig, Any]:
    """(ModelConfig, params) from model.hf_dir, or a random init of model.preset. `sharding`
    (a params-shaped tree of shardings) places each leaf straight where it belongs: HF
    tensors leaf by leaf as they are read, a random init computed sharded."""
    model = model_config(config)
    if config.model.hf_dir:
        return model, load_hf(hf_dir(config), dtype=config.model.param_dtype, sharding=sharding, progress=False)[1]
    init = functools.partial(init_params, model, config.seed, config.model.param_dtype)
    return model, jax.jit(init, out_shardings=sharding)()  # jitted either way: the same values
