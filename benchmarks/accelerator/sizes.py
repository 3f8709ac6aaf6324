"""What each section runs on each backend, and the time each may take.

"cpu" is the CI size (the whole suite in well under 2 minutes on 2 busy cores); "gpu" is
sized for one H200 and "tpu" mirrors it with splash attention. docs/accelerator_suite.md
derives the "gpu" budgets (compile times, steps, timings) that sum to at most 8 minutes.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ParitySizes:
    rows: int
    text_tokens: int
    """Text tokens per row around one image."""
    image_grid: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class StepSizes:
    preset: str
    """ModelConfig preset whose widths the step keeps (its decoder depth is cut to `depths`)."""
    depths: tuple[int, int]
    """Two decoder depths: their difference gives the per-layer figures."""
    lengths: tuple[int, ...]
    """Tokens per packed row."""
    rows: int
    attention: str
    warmup: int
    timed: int
    matmul: int
    """Side of the square bf16 matmul timed as the chip's achievable rate."""


@dataclasses.dataclass(frozen=True)
class AttentionSizes:
    lengths: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    implementations: tuple[str, ...]
    """The first is the reference the others are compared with."""
    timed: int


@dataclasses.dataclass(frozen=True)
class DecodeSizes:
    batch: int
    prompt: int
    new_tokens: int
    slice_preset: str
    slice_depth: int
    dtype: str
    decode_chunk: int
    repeats: int
    roofline_rows: int
    roofline_caches: tuple[int, ...]
    """The decode step against its roofline (benchmarks/engine_roofline.py) at these rows x
    cache lengths, with the bandwidth and matmul rate measured on these sizes."""
    bandwidth_mib: int
    matmul: int


@dataclasses.dataclass(frozen=True)
class SuiteSizes:
    kind: str
    parity: ParitySizes
    step: StepSizes
    attention: AttentionSizes
    decode: DecodeSizes
    budgets_s: tuple[tuple[str, float], ...]
    """Wall-clock limit of each section's process (start-up, compiles and runs); the
    environment section, run before the backend is known, has ENVIRONMENT_S."""
    xla_flags: str = ""
    """Added to XLA_FLAGS of every section's process."""

    def budget(self, section: str) -> float:
        return dict(self.budgets_s)[section]


SECTIONS = ("environment", "parity", "step", "attention", "decode")
ENVIRONMENT_S = 45.0

_CPU = SuiteSizes(
    kind="cpu",
    parity=ParitySizes(rows=2, text_tokens=48, image_grid=(1, 8, 8)),
    step=StepSizes(
        preset="tiny", depths=(1, 2), lengths=(256,), rows=1, attention="blockwise", warmup=1, timed=2, matmul=512
    ),
    attention=AttentionSizes(
        lengths=(256, 512), heads=4, kv_heads=2, head_dim=32, implementations=("blockwise", "dense"), timed=3
    ),
    decode=DecodeSizes(
        batch=8,
        prompt=16,
        new_tokens=16,
        slice_preset="tiny",
        slice_depth=1,
        dtype="float32",
        decode_chunk=8,
        repeats=1,
        roofline_rows=4,
        roofline_caches=(64,),
        bandwidth_mib=64,
        matmul=256,
    ),
    budgets_s=(("parity", 90.0), ("step", 150.0), ("attention", 90.0), ("decode", 90.0)),
    xla_flags="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
)

_GPU = SuiteSizes(
    kind="gpu",
    parity=ParitySizes(rows=4, text_tokens=480, image_grid=(1, 16, 16)),
    step=StepSizes(
        preset="7b", depths=(2, 4), lengths=(8192, 32768), rows=1, attention="cudnn", warmup=1, timed=3, matmul=8192
    ),
    attention=AttentionSizes(
        lengths=(8192, 32768), heads=28, kv_heads=4, head_dim=128, implementations=("blockwise", "cudnn"), timed=5
    ),
    decode=DecodeSizes(
        batch=64,
        prompt=512,
        new_tokens=128,
        slice_preset="7b",
        slice_depth=4,
        dtype="bfloat16",
        decode_chunk=16,
        repeats=2,
        roofline_rows=32,
        roofline_caches=(1024,),
        bandwidth_mib=1024,
        matmul=8192,
    ),
    budgets_s=(("parity", 45.0), ("step", 255.0), ("attention", 60.0), ("decode", 70.0)),
)

SIZES = {
    "cpu": _CPU,
    "gpu": _GPU,
    "tpu": dataclasses.replace(
        _GPU,
        kind="tpu",
        step=dataclasses.replace(_GPU.step, attention="splash"),
        attention=dataclasses.replace(_GPU.attention, implementations=("blockwise", "splash")),
    ),
}


def sizes_for(kind: str) -> SuiteSizes:
    if kind not in SIZES:
        raise ValueError(f"no sizes for backend {kind!r}; choose one of {sorted(SIZES)}")
    return SIZES[kind]
