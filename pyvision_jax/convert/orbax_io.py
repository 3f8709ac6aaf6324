"""A Flax params checkpoint directory: an orbax checkpoint of the params pytree, the model's
config.json beside it, and optionally the HF side files (tokenizer, chat template, ...)
carried along so that a later export is a complete HF directory again.

Layout::

    DIR/config.json   (Hub layout, convert.hf_config)
    DIR/params/       (orbax StandardCheckpointer)
    DIR/hf_files/     (optional, copied verbatim)
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from pyvision_jax.convert import names
from pyvision_jax.convert.hf import check_destination
from pyvision_jax.convert.hf_config import (
    CONFIG_FILE,
    hf_config_dict,
    model_config_from_hf,
    read_hf_config,
    write_hf_config,
)
from pyvision_jax.convert.tree import Params, ShardingSpec, leaf_sharding, set_leaf
from pyvision_jax.models.config import ModelConfig

PARAMS_DIR = "params"
HF_FILES_DIR = "hf_files"


def save_params(
    config: ModelConfig,
    params: Mapping,
    out_dir: str | os.PathLike,
    extra_files: Iterable[str | os.PathLike] = (),
    overwrite: bool = False,
) -> Path:
    """Writes ``params`` (orbax) and ``config`` into ``out_dir`` atomically; returns its path."""
    out_dir, extra = check_destination(out_dir, extra_files, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        # zstd compression (orbax's default) buffers a compressed copy of every array before
        # writing, doubling peak host memory; bf16 weights gain little from it.
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=False)) as checkpointer:
            checkpointer.save(staging / PARAMS_DIR, args=ocp.args.PyTreeSave(dict(params)))
        write_hf_config(staging, hf_config_dict(config))
        if extra:
            (staging / HF_FILES_DIR).mkdir()
            for file in extra:
                shutil.copy2(file, staging / HF_FILES_DIR / file.name)
        if out_dir.exists():
            previous = out_dir.with_name(f".{out_dir.name}.previous-{uuid.uuid4().hex[:8]}")
            os.rename(out_dir, previous)
            os.rename(staging, out_dir)
            shutil.rmtree(previous)
        else:
            os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _stored_leaves(params_dir: Path) -> dict[names.ParamPath, tuple[np.dtype, tuple[int, ...]]]:
    """Per-leaf (dtype, shape) recorded in the orbax metadata, keyed by params path (int list keys)."""
    tree = ocp.StandardCheckpointer().metadata(params_dir).item_metadata.tree
    stored: dict[names.ParamPath, tuple[np.dtype, tuple[int, ...]]] = {}

    def visit(node: Any, prefix: names.ParamPath) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                visit(child, (*prefix, int(key) if str(key).isdigit() else key))
        else:
            stored[prefix] = (np.dtype(node.dtype), tuple(node.shape))

    visit(tree, ())
    return stored


def load_params(
    ckpt_dir: str | os.PathLike, dtype: Any = None, sharding: ShardingSpec = None
) -> tuple[ModelConfig, Params]:
    """Reads a directory written by ``save_params`` as ``(ModelConfig, params)``.

    The expected tree comes from config.json, so a checkpoint of another shape fails with
    the offending leaves named. ``dtype``/``sharding`` as in ``load_hf``.
    """
    ckpt_dir = Path(ckpt_dir).absolute()
    config_path, params_dir = ckpt_dir / CONFIG_FILE, ckpt_dir / PARAMS_DIR
    for required in (config_path, params_dir):
        if not required.exists():
            raise FileNotFoundError(f"{required}: no such file or directory (expected a params checkpoint)")
    hf_config = read_hf_config(config_path)
    config = model_config_from_hf(hf_config, source=str(config_path))
    stored = _stored_leaves(params_dir)
    target: Params = {}
    problems = []
    for path, spec in names.param_leaves(hf_config).items():
        where = "/".join(map(str, path))
        if path not in stored:
            problems.append(where)
            continue
        shape = spec.shape
        if stored[path][1] != shape:
            problems.append(f"{where} (stored shape {list(stored[path][1])}, config needs {list(shape)})")
            continue
        leaf_dtype = jnp.dtype(dtype) if dtype is not None else stored[path][0]
        set_leaf(target, path, jax.ShapeDtypeStruct(shape, leaf_dtype, sharding=leaf_sharding(sharding, path, shape)))
    if problems:
        raise ValueError(
            f"{params_dir} lacks leaves that {config_path} requires, or holds them "
            f"with other shapes: {', '.join(problems)}"
        )
    try:
        params = ocp.StandardCheckpointer().restore(params_dir, target)
    except ValueError as err:
        raise ValueError(f"{params_dir} does not match {config_path}: {err}") from None
    return config, params


def hf_side_files(ckpt_dir: str | os.PathLike) -> list[Path]:
    """The HF side files stored with a params checkpoint (empty when there are none)."""
    directory = Path(ckpt_dir) / HF_FILES_DIR
    return sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
