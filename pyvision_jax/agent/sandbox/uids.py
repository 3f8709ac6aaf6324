"""Uids of runtimes on a root host: each runtime drops to a random uid of its own, so that file
permissions and the process limit apply to it alone."""

from __future__ import annotations

import random
import threading

from pyvision_jax.agent.sandbox.errors import SandboxStartError

_taken_uids: set[int] = set()
_taken_uids_lock = threading.Lock()


def _mapped_ids(map_path: str) -> list[tuple[int, int]]:
    try:
        with open(map_path) as handle:
            rows = [line.split() for line in handle if line.strip()]
    except OSError:
        return [(0, 1 << 32)]
    return [(int(inside), int(inside) + int(count)) for inside, _, count in rows]


def claim_uid() -> int:
    """A random uid (and gid), mapped here, that no other live runtime of ours uses."""
    ranges = []
    for low, high in _mapped_ids("/proc/self/uid_map"):
        for gid_low, gid_high in _mapped_ids("/proc/self/gid_map"):
            start, stop = max(low, gid_low, 1_000_000), min(high, gid_high, 1 << 31)
            if stop - start > 1000:
                ranges.append((start, stop))
    if not ranges:
        raise SandboxStartError(
            "no unused uid range is mapped in this user namespace to run sandboxes under (need uids >= 1000000)"
        )
    start, stop = max(ranges, key=lambda item: item[1] - item[0])
    with _taken_uids_lock:
        while True:
            uid = random.randrange(start, stop)
            if uid not in _taken_uids:
                _taken_uids.add(uid)
                return uid


def release_uid(uid: int | None) -> None:
    """Makes a claimed uid available again (None: nothing was claimed)."""
    with _taken_uids_lock:
        _taken_uids.discard(uid)
