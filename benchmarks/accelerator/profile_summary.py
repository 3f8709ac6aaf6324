"""Where a step's time goes: one call under `jax.profiler.trace`, its XLA ops summed by kind.

The trace (an XSpace protobuf) is read back with `jax.profiler.ProfileData`. Device planes
("/device:GPU:0", TPU) hold one event per executed op (or kernel); on CPU the host threads'
events that carry an `hlo_op` stat are the executed ops. Each op is put in a category from
its names (the op, its `hlo_category` / `long_name` stats when present): matmul, attention,
collective, copy (copies, transposes, slices, updates), other fusion.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
from typing import Any, Callable

import jax

CATEGORIES = (
    ("attention", ("fmha", "flash", "cudnn", "attention", "splash")),
    ("matmul", ("gemm", "dot", "matmul", "cublas", "cutlass", "convolution", "ynn_fusion")),
    ("collective", ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "nccl", "collective")),
    ("copy", ("copy", "transpose", "memcpy", "memset", "dynamic-update-slice", "dynamic-slice", "slice")),
)


def categorize(text: str) -> str:
    lowered = text.lower()
    for category, needles in CATEGORIES:
        if any(needle in lowered for needle in needles):
            return category
    return "other"


def _stats(event: Any) -> dict[str, str]:
    try:
        return {str(key): str(value) for key, value in event.stats}
    except (AttributeError, TypeError, ValueError):
        return {}


def op_events(profile: Any) -> list[tuple[str, str, float]]:
    """(op name, category text, seconds) of every executed op in a ProfileData."""
    device_planes = [p for p in profile.planes if p.name.startswith("/device:")]
    found = []
    for plane in device_planes or profile.planes:
        lines = list(plane.lines)
        op_lines = [line for line in lines if "xla ops" in line.name.lower()]
        for line in op_lines if device_planes and op_lines else lines:
            for event in line.events:
                stats = _stats(event)
                if not device_planes and "hlo_op" not in stats:
                    continue
                name = stats.get("hlo_op", event.name)
                text = " ".join((event.name, name, stats.get("hlo_category", ""), stats.get("long_name", "")[:300]))
                found.append((name, text, event.duration_ns * 1e-9))
    return found


def summarize(events: list[tuple[str, str, float]], top: int = 8) -> dict[str, Any]:
    """Total op seconds, the share of each category and the `top` ops by time."""
    total = sum(seconds for _, _, seconds in events)
    by_category: collections.Counter[str] = collections.Counter()
    by_op: collections.Counter[str] = collections.Counter()
    for name, text, seconds in events:
        by_category[categorize(text)] += seconds
        by_op[name] += seconds
    share = {category: seconds / total for category, seconds in by_category.most_common()} if total else {}
    return {
        "op_seconds": total,
        "ops": len(events),
        "category_share": share,
        "top_ops": [(name, seconds) for name, seconds in by_op.most_common(top)],
    }


def profile_call(run: Callable[[], Any]) -> dict[str, Any]:
    """Runs `run` once under the profiler (its result made ready inside the trace) and
    returns the summary of its ops, or {"error": why there is none}: a profiler that does
    not work on a machine costs the summary, not the measurement around it."""
    with tempfile.TemporaryDirectory() as trace_dir:
        try:
            with jax.profiler.trace(trace_dir):
                jax.block_until_ready(run())
            files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
            if not files:
                return {"error": "the profiler wrote no trace"}
            return summarize(op_events(jax.profiler.ProfileData.from_file(files[0])))
        except Exception as error:  # noqa: BLE001 (reported in the results instead)
            return {"error": f"{type(error).__name__}: {str(error)[:300]}"}
