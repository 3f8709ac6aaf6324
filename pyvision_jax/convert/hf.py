"""Hugging Face Qwen2.5-VL checkpoint directories <-> (ModelConfig, Flax params pytree).

Both directions stream one params leaf at a time, so peak host memory stays near one copy of
the model plus one leaf: tensors are read with ``readinto`` into their final Flax layout (the
layers of a stacked leaf into its slices) and each leaf is placed on devices before the next
is read; on export each layer of a leaf is fetched on its own and written in row chunks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from pyvision_jax.convert import names
from pyvision_jax.convert.hf_config import (
    CONFIG_FILE,
    hf_config_dict,
    model_config_from_hf,
    read_hf_config,
    write_hf_config,
)
from pyvision_jax.convert.layout import hf_chunks, read_flax_leaf
from pyvision_jax.convert.names import ParamPath
from pyvision_jax.convert.safetensors_io import TensorEntry, TensorSpec, read_header, write_file
from pyvision_jax.convert.tree import Params, ShardingSpec, flatten_params, host_copy, leaf_sharding, set_leaf
from pyvision_jax.models.config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
LayerOf = tuple[Any, int | None]
"""A tensor's place in a params tree: its leaf and the layer index within a stacked leaf."""


class CheckpointMismatchError(ValueError):
    """Tensors missing, unexpected, duplicated or of the wrong shape, all listed by name."""

    def __init__(
        self,
        source: str,
        missing: Iterable[str] = (),
        unexpected: Iterable[str] = (),
        mis_shaped: Iterable[str] = (),
        duplicated: Iterable[str] = (),
    ):
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        self.mis_shaped, self.duplicated = sorted(mis_shaped), sorted(duplicated)
        lines = [f"{source} does not match its config:"]
        for title, items in (
            ("missing tensors", self.missing),
            ("unexpected tensors", self.unexpected),
            ("tensors with the wrong shape", self.mis_shaped),
            ("tensors stored twice", self.duplicated),
        ):
            if items:
                lines.append(f"  {len(items)} {title}:")
                lines.extend(f"    {item}" for item in items)
        super().__init__("\n".join(lines))

    @property
    def problems(self) -> bool:
        return bool(self.missing or self.unexpected or self.mis_shaped or self.duplicated)


# ---------------------------------------------------------------------------- load


def side_files(hf_dir: str | os.PathLike) -> list[Path]:
    """Files of an HF directory other than weights, index and config.json (tokenizer, chat
    template, generation and preprocessor configs), to carry along through a conversion."""
    skip = {INDEX_FILE, CONFIG_FILE}
    return sorted(
        p for p in Path(hf_dir).iterdir() if p.is_file() and p.suffix != ".safetensors" and p.name not in skip
    )


def _weight_files(hf_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Safetensors files of a checkpoint and, when sharded, the index's weight map."""
    index_path = hf_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{index_path}: not a safetensors index with a 'weight_map' ({err})") from None
        files = [hf_dir / name for name in sorted(set(weight_map.values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index_path} lists shard files that do not exist: {', '.join(absent)}")
        return files, weight_map
    if (hf_dir / SINGLE_FILE).is_file():
        return [hf_dir / SINGLE_FILE], None
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no {INDEX_FILE}, {SINGLE_FILE} or other *.safetensors file")
    return files, None


def _checkpoint_entries(
    hf_dir: Path,
    hf_config: Mapping[str, Any],
    files: Sequence[Path] | None = None,
    include: Callable[[ParamPath], bool] | None = None,
) -> dict[str, TensorEntry]:
    """Header entries of every stored tensor, keyed by Hub name, after checking them all
    against the shapes the config implies; raises one error listing every problem. `files`
    replace the directory's own weight files; tensors whose Flax path `include` rejects are
    neither expected nor read."""
    weight_map = None
    if files is None:
        files, weight_map = _weight_files(hf_dir)
    expected = names.checkpoint_shapes(hf_config)
    if include is not None:
        skipped = {n for n in expected if not include(names.flax_path(n))}
        expected = {n: shape for n, shape in expected.items() if n not in skipped}
    entries: dict[str, TensorEntry] = {}
    seen: dict[str, str] = {}
    unexpected, mis_shaped, duplicated = [], [], []
    for file in files:
        file_entries, _ = read_header(file)
        for stored_name, entry in file_entries.items():
            name = names.hub_name(stored_name)
            where = f"{stored_name} (in {file.name})"
            if names.is_tied_lm_head(name, hf_config) or (include is not None and name in skipped):
                continue
            if name not in expected:
                unexpected.append(where)
            elif name in seen:
                duplicated.append(f"{name} (as {seen[name]} and {where})")
            elif entry.shape != expected[name]:
                mis_shaped.append(f"{where}: shape {list(entry.shape)}, expected {list(expected[name])}")
            else:
                entries[name] = entry
            seen.setdefault(name, where)
    listed = {names.hub_name(n): f for n, f in (weight_map or {}).items()}
    missing = [
        n + (f" ({INDEX_FILE} places it in {listed[n]})" if n in listed else "") for n in expected if n not in seen
    ]
    mismatch = CheckpointMismatchError(str(hf_dir), missing, unexpected, mis_shaped, duplicated)
    if mismatch.problems:
        raise mismatch
    return entries


def load_hf(
    hf_dir: str | os.PathLike,
    dtype: Any = None,
    sharding: ShardingSpec = None,
    progress: bool = True,
    *,
    weight_files: Sequence[Path] | None = None,
    include: Callable[[ParamPath], bool] | None = None,
) -> tuple[ModelConfig, Params]:
    """Loads an HF Qwen2.5-VL directory as ``(ModelConfig, params)``.

    ``weight_files`` (safetensors files, possibly in other directories) replace the
    directory's own; ``include(flax_path)`` restricts the load to some leaves (a published
    version's trainable groups, its frozen tower read once).

    Accepts a single ``model.safetensors`` or shards with ``model.safetensors.index.json``,
    Hub names or transformers-v5 names. ``dtype`` (e.g. ``"bfloat16"``) casts every tensor,
    ``None`` keeps the stored dtypes. ``sharding`` is a ``jax.sharding.Sharding`` for every
    leaf, a params-shaped tree of them, or ``fn(path, shape) -> Sharding``; each leaf (all
    layers of a stacked one) is placed with ``jax.device_put`` before the next is read.
    """
    hf_dir = Path(hf_dir)
    hf_config = read_hf_config(hf_dir)
    config = model_config_from_hf(hf_config, source=str(hf_dir / CONFIG_FILE))
    entries = _checkpoint_entries(hf_dir, hf_config, weight_files, include)
    target = None if dtype is None else np.dtype(jnp.dtype(dtype))
    leaves = sorted(
        ((path, spec) for path, spec in names.param_leaves(hf_config).items() if include is None or include(path)),
        key=lambda item: (str(entries[item[1].tensors[0]].file), entries[item[1].tensors[0]].start),
    )
    params: Params = {}
    total = sum(e.nbytes for e in entries.values())
    with (
        tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {hf_dir.name}", disable=not progress) as bar,
        contextlib.ExitStack() as files,
    ):
        handles: dict[Path, BinaryIO] = {}

        def read(name: str) -> np.ndarray:
            entry = entries[name]
            if entry.file not in handles:
                handles[entry.file] = files.enter_context(open(entry.file, "rb"))
            bar.update(entry.nbytes)
            return read_flax_leaf(handles[entry.file], entry, names.tensor_kind(name), target)

        for path, spec in leaves:
            if spec.stacked:
                leaf = np.empty(spec.shape, np.dtype(target or entries[spec.tensors[0]].dtype))
                for layer, name in enumerate(spec.tensors):
                    leaf[layer] = read(name)
            else:
                leaf = read(spec.tensors[0])
            set_leaf(params, path, jax.device_put(leaf, leaf_sharding(sharding, path, leaf.shape)))
            del leaf
    return config, params


# ---------------------------------------------------------------------------- save


def checked_tensors(config: ModelConfig, params: Mapping, complete: bool = True) -> dict[str, LayerOf]:
    """Every Hub tensor name of ``config``'s checkpoint -> (leaf, layer index or None) in
    ``params``, in checkpoint order, after checking the tree; one error lists every problem.
    ``complete=False`` accepts a tree of some leaves only (the names of the others are left out)."""
    hf_config = hf_config_dict(config)
    expected = names.param_leaves(hf_config)
    found: dict[str, LayerOf] = {}
    unexpected, mis_shaped = [], []
    flat = flatten_params(params)
    for path, leaf in flat.items():
        where = "/".join(map(str, path))
        spec = expected.get(path)
        if spec is None:
            unexpected.append(where)
        elif tuple(leaf.shape) != spec.shape:
            mis_shaped.append(
                f"{where} ({spec.tensors[0]}{', ...' if spec.stacked else ''}): "
                f"shape {list(leaf.shape)}, expected {list(spec.shape)}"
            )
        else:
            found |= {name: (leaf, layer if spec.stacked else None) for layer, name in enumerate(spec.tensors)}
    missing = [
        "/".join(map(str, path)) + f" ({spec.tensors[0]}{', ...' if spec.stacked else ''})"
        for path, spec in expected.items()
        if path not in flat and complete
    ]
    mismatch = CheckpointMismatchError("params tree", missing, unexpected, mis_shaped)
    if mismatch.problems:
        raise mismatch
    return {name: found[name] for name in names.checkpoint_shapes(hf_config) if name in found}


def layer_value(leaf: Any, layer: int | None) -> np.ndarray:
    """A host copy of one tensor: the whole leaf, or one layer of a stacked leaf (sliced
    before the copy, so that an export never holds a whole stacked leaf on the host)."""
    return host_copy(leaf if layer is None else leaf[layer])


def _export_specs(
    config: ModelConfig, params: Mapping, dtype: np.dtype | None
) -> tuple[dict[str, Any], list[tuple[TensorSpec, LayerOf]]]:
    """Hub config dict and the (spec, (leaf, layer)) pairs to write, after checking the tree."""
    hf_config = hf_config_dict(config)
    shapes = names.checkpoint_shapes(hf_config)
    tensors = checked_tensors(config, params)
    specs = [
        (TensorSpec(n, np.dtype(dtype or leaf.dtype), shapes[n]), (leaf, layer)) for n, (leaf, layer) in tensors.items()
    ]
    return hf_config, specs


def _plan_shards(specs: list[tuple[TensorSpec, Any]], max_shard_bytes: int) -> list[list[tuple[TensorSpec, Any]]]:
    shards: list[list[tuple[TensorSpec, Any]]] = [[]]
    size = 0
    for spec, leaf in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((spec, leaf))
        size += spec.nbytes
    return shards


def _host_chunks(tensor: LayerOf, spec: TensorSpec) -> Iterator[np.ndarray]:
    yield from hf_chunks(layer_value(*tensor), names.tensor_kind(spec.name), spec.dtype)


def _config_dtype(specs: list[tuple[TensorSpec, Any]]) -> str:
    """The ``torch_dtype`` to record: the dtype holding most of the bytes."""
    bytes_by_dtype: dict[str, int] = defaultdict(int)
    for spec, _ in specs:
        bytes_by_dtype[spec.dtype.name] += spec.nbytes
    return max(bytes_by_dtype, key=bytes_by_dtype.__getitem__)


def check_destination(
    out_dir: str | os.PathLike, extra_files: Iterable[str | os.PathLike], overwrite: bool
) -> tuple[Path, list[Path]]:
    """The absolute output directory and the extra files to copy, after checking that the
    directory may be written and that every extra file exists."""
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists (pass overwrite=True to replace it)")
    extra = [Path(f) for f in extra_files]
    absent = [str(f) for f in extra if not f.is_file()]
    if absent:
        raise FileNotFoundError(f"extra files to copy do not exist: {', '.join(absent)}")
    return out_dir, extra


def exported_config(config: ModelConfig, source_dir: str | os.PathLike) -> dict[str, Any]:
    """The config.json of ``source_dir`` (the model a run started from) as an export's
    config.json: every key kept, after checking that it describes ``config``'s architecture."""
    source_config = read_hf_config(Path(source_dir))
    source = str(Path(source_dir) / CONFIG_FILE)
    described = model_config_from_hf(source_config, source=source).replace(attention=config.attention)
    if described != config:
        differing = [
            f.name for f in dataclasses.fields(config) if getattr(described, f.name) != getattr(config, f.name)
        ]
        raise ValueError(f"{source} describes another architecture than the params (differing: {', '.join(differing)})")
    return source_config


def save_hf(
    config: ModelConfig,
    params: Mapping,
    out_dir: str | os.PathLike,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    dtype: Any = None,
    overwrite: bool = False,
    extra_files: Iterable[str | os.PathLike] = (),
    progress: bool = True,
    config_from: str | os.PathLike | None = None,
) -> Path:
    """Writes ``params`` as a Hub-layout HF checkpoint directory and returns its path.

    Shards named like transformers' (``model-00001-of-00003.safetensors`` + index, or a single
    ``model.safetensors``), ``config.json`` with the stored dtype, and ``extra_files``
    (tokenizer, chat template, ...) copied beside them. config.json is that of the HF directory
    ``config_from`` with all its keys when given (the model the params were trained from; it
    must describe ``config``'s architecture), else ``hf_config_dict(config)``. Everything is
    written into a temporary sibling directory that is renamed into place at the end, so a
    crash never leaves a half-written ``out_dir``. ``dtype`` casts on export.
    """
    out_dir, extra = check_destination(out_dir, extra_files, overwrite)
    target = None if dtype is None else np.dtype(jnp.dtype(dtype))
    hf_config, specs = _export_specs(config, params, target)
    if config_from is not None:
        hf_config = exported_config(config, config_from)
    shards = _plan_shards(specs, max_shard_bytes)
    file_names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        leaf_of = {spec.name: leaf for spec, leaf in specs}
        total = sum(spec.nbytes for spec, _ in specs)
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {out_dir.name}", disable=not progress) as bar:
            for file_name, shard in zip(file_names, shards):
                write_file(
                    staging / file_name,
                    [spec for spec, _ in shard],
                    lambda spec: _host_chunks(leaf_of[spec.name], spec),
                    on_tensor_written=lambda spec: bar.update(spec.nbytes),
                )
        if len(shards) > 1:
            weight_map = {spec.name: f for f, shard in zip(file_names, shards) for spec, _ in shard}
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        write_hf_config(staging, hf_config, dtype=_config_dtype(specs))
        for file in extra:
            shutil.copy2(file, staging / file.name)
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Renames ``staging`` to ``out_dir``, moving an existing ``out_dir`` aside first."""
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    previous = out_dir.with_name(f".{out_dir.name}.previous-{uuid.uuid4().hex[:8]}")
    os.rename(out_dir, previous)
    os.rename(staging, out_dir)
    shutil.rmtree(previous)


def save_tensors(config: ModelConfig, params: Mapping, path: str | os.PathLike, dtype: Any = None) -> int:
    """Writes the leaves of ``params`` (all of ``config``'s or some top-level groups) as
    Hub-named tensors into one safetensors file, cast to ``dtype``; returns the bytes
    written. Leaves are copied to the host one tensor (one layer) at a time."""
    target = None if dtype is None else np.dtype(jnp.dtype(dtype))
    shapes = names.checkpoint_shapes(hf_config_dict(config))
    tensors = checked_tensors(config, params, complete=False)
    specs = [TensorSpec(n, np.dtype(target or leaf.dtype), shapes[n]) for n, (leaf, _) in tensors.items()]
    write_file(Path(path), specs, lambda spec: _host_chunks(tensors[spec.name], spec))
    return sum(spec.nbytes for spec in specs)
