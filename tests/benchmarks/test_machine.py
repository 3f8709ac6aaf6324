"""The machine description benchmarks write into their results files."""

from __future__ import annotations

import os
import re

from benchmarks.machine import describe_machine


def test_the_description_names_this_machines_cores_memory_and_processor():
    cores, memory_gib, processor = re.fullmatch(r"(\d+) CPU cores, (\d+) GiB, (\S.*)", describe_machine()).groups()
    with open("/proc/meminfo") as meminfo:
        total_gib = int(meminfo.readline().split()[1]) / 2**20
    assert int(cores) == os.cpu_count()
    assert abs(int(memory_gib) - total_gib) <= 1
    assert processor
