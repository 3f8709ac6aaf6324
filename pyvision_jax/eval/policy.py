"""The policy to evaluate, from any of the three checkpoint layouts the project writes.

- ``hf``: a Hugging Face directory (``config.json`` + ``*.safetensors``), e.g. a Hub download
  or ``launch/convert.py flax2hf`` output; loaded with ``convert.load_hf``.
- ``params``: a Flax params checkpoint (``config.json`` + ``params/``) written by
  ``launch/convert.py hf2flax`` (``convert.save_params``).
- ``train``: a training checkpoint of ``train.checkpoint.TrainCheckpoints``: the trainer's
  workdir, its ``checkpoints/`` directory (the latest step is taken) or one step directory.
  Only the ``params`` subtree of the saved TrainState is read (orbax partial restore), so
  the optimizer state never costs memory. The model architecture comes from the trainer's
  resolved ``config.json`` in the workdir when present, else from the evaluation config's
  ``model`` section (the caller's ``model_for`` turns either into a ``ModelConfig``); the
  policy version is the checkpoint step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from pyvision_jax.convert import load_hf, load_params
from pyvision_jax.convert.hf_config import CONFIG_FILE
from pyvision_jax.convert.orbax_io import HF_FILES_DIR, PARAMS_DIR
from pyvision_jax.convert.orbax_reports import first_line, quiet_orbax
from pyvision_jax.convert.run_layout import CHECKPOINT_DIR, RESOLVED_CONFIG, STATE_ITEM
from pyvision_jax.models import ModelConfig, init_params

CheckpointKind = Literal["hf", "params", "train"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ParamsMismatchError(ValueError):
    """A training checkpoint's params are another architecture's than the config's."""


@dataclass(frozen=True)
class LoadedPolicy:
    """Weights and what is known about where they came from."""

    kind: CheckpointKind
    path: str
    model_config: ModelConfig
    params: Any
    version: int
    tokenizer_dir: str | None
    """A directory with tokenizer files found with the checkpoint (None when absent)."""
    skipped: tuple[str, ...] = ()
    """Newer training checkpoints that could not be read, one line each (why this step)."""


def _step_dirs(directory: Path) -> list[Path]:
    return (
        sorted(
            (p for p in directory.iterdir() if p.name.isdigit() and (p / STATE_ITEM).is_dir()),
            key=lambda p: int(p.name),
        )
        if directory.is_dir()
        else []
    )


def _train_step_dirs(path: Path) -> list[Path]:
    """The step directories a training-checkpoint path designates, newest first: the one
    step it names, or every step of a workdir or checkpoints directory."""
    if (path / STATE_ITEM).is_dir() and path.name.isdigit():
        return [path]
    for directory in (path, path / CHECKPOINT_DIR):
        steps = _step_dirs(directory)
        if steps:
            return steps[::-1]
    return []


def detect_checkpoint_kind(path: str | Path) -> CheckpointKind:
    """Which layout ``path`` holds; a clear error when it is none of them."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    if (path / CONFIG_FILE).is_file() and any(path.glob("*.safetensors")):
        return "hf"
    if (path / CONFIG_FILE).is_file() and (path / PARAMS_DIR).is_dir():
        return "params"
    if _train_step_dirs(path):
        return "train"
    raise ValueError(
        f"{path} is not a checkpoint: expected an HF directory (config.json + *.safetensors), "
        f"a params checkpoint (config.json + params/) or a training checkpoint (a workdir with "
        f"checkpoints/<step>/state, a checkpoints directory, or one <step>/state directory)"
    )


ModelFor = Callable[[dict[str, Any] | None], ModelConfig]
"""The architecture of a training checkpoint from the trainer's resolved config (a dict), or
from the evaluation's own config when there is none (None)."""


def run_config(step_dir: str | Path) -> dict[str, Any] | None:
    """The resolved config.json of the run whose checkpoint ``step_dir`` is (a dict with a
    ``model`` section), or None when no run config lies above it."""
    for parent in Path(step_dir).absolute().parents:
        resolved = parent / RESOLVED_CONFIG
        if resolved.is_file() and (parent / CHECKPOINT_DIR).is_dir():
            data = json.loads(resolved.read_text())
            if isinstance(data, dict) and isinstance(data.get("model"), dict):
                return data
    return None


def _train_model_config(step_dir: Path, model_for: ModelFor) -> ModelConfig:
    """The trainer's resolved config beside its checkpoints wins over the evaluation config."""
    return model_for(run_config(step_dir))


def _restore_train_params(step_dir: Path, model_config: ModelConfig, dtype: Any = None) -> Any:
    """The params subtree of a saved TrainState, cast to ``dtype`` (None: as stored)."""
    expected = jax.eval_shape(lambda: init_params(model_config))
    state_dir = step_dir / STATE_ITEM
    stored = ocp.StandardCheckpointer().metadata(state_dir).item_metadata.tree
    if "params" not in stored:
        raise ValueError(f"{state_dir}: the saved train state has no 'params' entry")
    is_leaf = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")  # noqa: E731
    stored_shapes = {
        jax.tree_util.keystr(k): tuple(v.shape)
        for k, v in jax.tree_util.tree_flatten_with_path(_int_keys(stored["params"]), is_leaf=is_leaf)[0]
    }
    wanted_shapes = {
        jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(expected)[0]
    }
    if stored_shapes != wanted_shapes:
        missing = sorted(set(wanted_shapes) - set(stored_shapes))[:5]
        extra = sorted(set(stored_shapes) - set(wanted_shapes))[:5]
        shape = sorted(k for k in set(wanted_shapes) & set(stored_shapes) if wanted_shapes[k] != stored_shapes[k])[:5]
        raise ParamsMismatchError(
            f"{state_dir}: params do not match the model config (missing {missing}, "
            f"unexpected {extra}, other shapes {shape}); pass the config the "
            f"checkpoint was trained with (--config / --config.model.*)"
        )
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), jnp.dtype(dtype or m.dtype)), stored["params"], is_leaf=is_leaf
    )
    restore_args = jax.tree.map(
        lambda a: ocp.ArrayRestoreArgs(sharding=device, global_shape=a.shape, dtype=a.dtype), abstract
    )
    restored = ocp.PyTreeCheckpointer().restore(
        state_dir,
        args=ocp.args.PyTreeRestore(
            item={"params": abstract}, restore_args={"params": restore_args}, partial_restore=True
        ),
    )
    return _int_keys(restored["params"])


def _int_keys(tree: Any) -> Any:
    """Orbax stores the integer keys of the params dict (layer indices) as strings."""
    if isinstance(tree, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v) for k, v in tree.items()}
    return tree


def _tokenizer_dir(directory: Path) -> str | None:
    """``directory`` when it holds tokenizer files, else None."""
    return str(directory) if any((directory / f).is_file() for f in TOKENIZER_FILES) else None


def checkpoint_tokenizer_dir(path: str | Path) -> str | None:
    """The tokenizer directory that comes with the checkpoint at ``path`` (an HF directory's own
    files, a params checkpoint's copied HF files), None when it carries none (training checkpoints:
    the run's model.hf_dir gives it)."""
    path = Path(path).absolute()
    kind = detect_checkpoint_kind(path)
    if kind == "hf":
        return _tokenizer_dir(path)
    if kind == "params":
        return _tokenizer_dir(path / HF_FILES_DIR)
    return None


def load_policy(
    path: str | Path, model_for: ModelFor, *, dtype: str | None = None, progress: bool = True
) -> LoadedPolicy:
    """Loads the weights at ``path`` (any layout of ``detect_checkpoint_kind``), cast to
    ``dtype`` (None: as stored)."""
    path = Path(path).absolute()
    kind = detect_checkpoint_kind(path)
    if kind == "hf":
        model_config, params = load_hf(path, dtype=dtype, progress=progress)
        return LoadedPolicy(kind, str(path), model_config, params, 0, checkpoint_tokenizer_dir(path))
    if kind == "params":
        model_config, params = load_params(path, dtype=dtype)
        return LoadedPolicy(kind, str(path), model_config, params, 0, checkpoint_tokenizer_dir(path))
    candidates = _train_step_dirs(path)
    model_config = _train_model_config(candidates[0], model_for)
    skipped: list[str] = []
    for step_dir in candidates:
        try:
            with quiet_orbax():
                params = _restore_train_params(step_dir, model_config, dtype)
        except ParamsMismatchError:
            raise  # another model's checkpoint, not a damaged one
        except Exception as error:  # noqa: BLE001 - a damaged checkpoint fails in many ways
            if len(candidates) == 1:
                raise
            skipped.append(f"checkpoint step {step_dir.name} is unreadable ({first_line(error)})")
            continue
        return LoadedPolicy(kind, str(step_dir), model_config, params, int(step_dir.name), None, tuple(skipped))
    raise ValueError(f"{path}: no readable training checkpoint ({'; '.join(skipped)})")
