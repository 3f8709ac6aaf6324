"""What the run is on: versions, backend, devices, and which attention kernels exist there."""

from __future__ import annotations

import platform
from typing import Any

import flax
import jax
import optax

from benchmarks.accelerator.measure import GIB, device_memory
from benchmarks.accelerator.records import SectionLog
from benchmarks.accelerator.sizes import SuiteSizes
from pyvision_jax.models.attention import cudnn_packed_layout_available

try:  # private; None on a jaxlib without CUDA
    from jax._src.lib import cuda_versions
except ImportError:
    cuda_versions = None


def cudnn_version() -> int | None:
    return None if cuda_versions is None else int(cuda_versions.cudnn_get_version())


def describe() -> dict[str, Any]:
    devices = jax.local_devices()
    memory = device_memory(devices[0])
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "backend": jax.default_backend(),
        "devices": len(devices),
        "device_kind": devices[0].device_kind,
        "memory_limit_gib": memory and memory["bytes_limit"] / GIB,
        "cudnn": cudnn_version(),
        "cudnn_packed_layout": cudnn_packed_layout_available(),
    }


def run(sizes: SuiteSizes | None, log: SectionLog) -> None:
    """`sizes` is None: this section runs before the backend, and so the sizes, are known."""
    info = describe()
    log.record(
        "versions",
        info,
        f"jax {info['jax']} on {info['backend']}: {info['devices']} x {info['device_kind']}"
        f", cuDNN {info['cudnn']}, packed cuDNN layout {info['cudnn_packed_layout']}",
    )
