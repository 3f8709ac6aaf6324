"""The device mesh of the trainer: `data` x `fsdp` x `tensor` axes, from config.

Sizes multiply to the number of devices; one size may be -1 to take whatever is left.
Multi-host runs call `initialize_distributed` before any other JAX call (the run harness does
it first when `train.distributed` is set), after which `jax.devices()` lists the devices of
every process. With several processes the mesh is hybrid: the processes (DCN, slow links)
split the `data` axis first, then `fsdp`, then `tensor`, and each process's own devices
(ICI, fast links) hold the rest, so the collectives of fsdp and tensor stay within a host
whenever the sizes allow it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
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
        raise ValueError(
            f"mesh sizes (data, fsdp, tensor) = {tuple(sizes)} multiply to {math.prod(sizes)}, "
            f"but there are {num_devices} devices (set train.mesh_* so that they match, "
            f"or use -1 for one axis)"
        )
    return tuple(sizes)


def split_over_processes(shape: Sequence[int], num_processes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per-process ICI shape, across-process DCN shape) of a mesh `shape`, their product per
    axis being `shape`: the processes take the data axis first, then fsdp, then tensor."""
    left, dcn = int(num_processes), []
    for size in shape:
        share = math.gcd(int(size), left)
        dcn.append(share)
        left //= share
    if left != 1:
        raise ValueError(
            f"mesh (data, fsdp, tensor) = {tuple(shape)} cannot be split over {num_processes} "
            f"processes (each axis split must divide it); make data or fsdp a multiple of it"
        )
    return tuple(size // share for size, share in zip(shape, dcn)), tuple(dcn)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes ("data", "fsdp", "tensor") over `devices` (default: all devices), hybrid
    (`split_over_processes`) when they belong to several processes."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    processes = len({d.process_index for d in devices})
    if processes == 1:
        return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)
    ici, dcn = split_over_processes(shape, processes)
    return Mesh(mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True), MESH_AXES)


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1) -> None:
    """`jax.distributed.initialize` for multi-host runs (once: a second call does nothing);
    empty arguments let JAX autodetect (TPU pods, SLURM, ...)."""
    if jax.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes > 0:
        kwargs["num_processes"] = num_processes
    if process_id >= 0:
        kwargs["process_id"] = process_id
    jax.distributed.initialize(**kwargs)


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """`jax.distributed` of a multi-host run; `enabled` False: one process. Empty fields let
    JAX autodetect (TPU pods, SLURM, ...)."""

    enabled: bool = False
    coordinator_address: str = ""
    num_processes: int = 0
    process_id: int = -1

    def initialize(self) -> None:
        """`initialize_distributed` when enabled; must run before any other JAX call."""
        if self.enabled:
            initialize_distributed(self.coordinator_address, self.num_processes, self.process_id)


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """Sizes of the (data, fsdp, tensor) mesh axes; one may be -1 (the rest of the devices)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def build(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        return make_mesh(self.data, self.fsdp, self.tensor, devices)
