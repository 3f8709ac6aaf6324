"""Hugging Face safetensors <-> Flax parameter conversion (streaming, Hub and transformers-v5 names)."""

from pyvision_jax.convert.hf import CheckpointMismatchError, load_hf, save_hf, save_tensors, side_files
from pyvision_jax.convert.orbax_io import hf_side_files, load_params, save_params

__all__ = [
    "CheckpointMismatchError",
    "hf_side_files",
    "load_hf",
    "load_params",
    "save_hf",
    "save_params",
    "save_tensors",
    "side_files",
]
