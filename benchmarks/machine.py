"""The machine a benchmark ran on, in the words its results file records."""

from __future__ import annotations

import os
import platform


def describe_machine() -> str:
    """CPU cores, memory and processor, e.g. "2 CPU cores, 24 GiB, x86_64"."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPU cores, {memory_gib:.0f} GiB, {platform.processor() or platform.machine()}"
