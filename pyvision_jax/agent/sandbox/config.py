"""The limits and options of a sandbox."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits and options of one sandbox.

    timeout_s: wall-clock limit of one call; overrunning it kills the runtime.
    max_stdout_bytes: printed bytes kept per call (the rest is counted and marked).
    max_image_pixels / max_aspect_ratio / max_images_per_call: per-call image guards; an image
      with aspect ratio >= max_aspect_ratio is refused.
    memory_bytes: memory of the sandbox, all its processes together (a memory cgroup per
      runtime, see `cgroups`), and the address space of each of them (RLIMIT_AS); where the host
      gives no usable memory cgroup, only the per-process limit holds (warned once per pool).
    max_processes: processes + threads of the sandbox (RLIMIT_NPROC, per runtime uid).
    max_file_bytes: largest file it can write (RLIMIT_FSIZE); tmpfs_bytes: size of its /tmp
      (and a quarter of it for /dev/shm).
    cpu_seconds: CPU seconds for the whole life of one runtime (RLIMIT_CPU).
    allow_unisolated: run without bubblewrap (and without namespaces) where it is missing.
    fork_runtimes: a pool forks its runtimes from a template that imported the runtime's
      libraries once (each fork in namespaces of its own); False, or where this host does not
      allow nested namespaces (warned once), each runtime starts in a fresh bubblewrap.
    """

    timeout_s: float = 30.0
    max_stdout_bytes: int = 16_384
    max_image_pixels: int = 16_000_000
    max_aspect_ratio: float = 200.0
    max_images_per_call: int = 8
    memory_bytes: int = 4 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    tmpfs_bytes: int = 256 << 20
    cpu_seconds: int = 600
    max_open_files: int = 1024
    startup_timeout_s: float = 60.0
    preload_timeout_s: float = 60.0
    allow_unisolated: bool = False
    bwrap_path: str | None = None
    fork_runtimes: bool = True

    def __post_init__(self) -> None:
        positive = (
            "timeout_s",
            "max_stdout_bytes",
            "max_image_pixels",
            "max_images_per_call",
            "memory_bytes",
            "max_processes",
            "max_file_bytes",
            "tmpfs_bytes",
            "cpu_seconds",
            "startup_timeout_s",
            "preload_timeout_s",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.max_aspect_ratio <= 1:
            raise ValueError(f"SandboxConfig.max_aspect_ratio must be > 1, got {self.max_aspect_ratio!r}")
        if self.max_open_files < 1024:
            raise ValueError(
                f"SandboxConfig.max_open_files must be >= 1024 (the runtime keeps "
                f"its channel on high descriptors), got {self.max_open_files!r}"
            )
