"""The device mesh of the trainer: `data` x `fsdp` x `tensor` axes, from config.

Sizes multiply to the number of devices; one size may be -1 to take whatever is left.
Multi-host runs call `jax.distributed.initialize` first (when `distributed` is set), after
which `jax.devices()` lists the devices of every host.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from pyvision_jax.models.sharding import MESH_AXES


def resolve_mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a single -1 filled in; errors name the offending sizes."""
    sizes = [int(data), int(fsdp), int(tensor)]
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes (data, fsdp, tensor) = {tuple(sizes)} must be >= 1 or -1")
    free = [i for i, s in enumerate(sizes) if s == -1]
    if len(free) > 1:
        raise ValueError(f"mesh sizes (data, fsdp, tensor) = {tuple(sizes)}: at most one may be -1")
    fixed = math.prod(s for s in sizes if s != -1)
    if free:
        if num_devices % fixed:
            raise ValueError(f"mesh sizes {tuple(sizes)}: {num_devices} devices are not divisible by {fixed}")
        sizes[free[0]] = num_devices // fixed
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh sizes (data, fsdp, tensor) = {tuple(sizes)} multiply to {math.prod(sizes)}, "
                         f"but there are {num_devices} devices (set train.mesh_* so that they match, "
                         f"or use -1 for one axis)")
    return tuple(sizes)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes ("data", "fsdp", "tensor") over `devices` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0,
                           process_id: int = -1) -> None:
    """`jax.distributed.initialize` for multi-host runs; empty arguments let JAX autodetect
    (TPU pods, SLURM, ...)."""
    kwargs = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes > 0:
        kwargs["num_processes"] = num_processes
    if process_id >= 0:
        kwargs["process_id"] = process_id
    jax.distributed.initialize(**kwargs)


def mesh_from_config(train_config) -> Mesh:
    """The mesh of a `config.train` block (mesh_data, mesh_fsdp, mesh_tensor, distributed)."""
    if train_config.get("distributed", False):
        initialize_distributed(train_config.get("coordinator_address", ""),
                               train_config.get("num_processes", 0), train_config.get("process_id", -1))
    return make_mesh(train_config.mesh_data, train_config.mesh_fsdp, train_config.mesh_tensor)
