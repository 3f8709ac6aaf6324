"""Probes of the host processes of sandbox runtimes, to prove that none survived their end,
and sandboxes of both kinds of runtime for tests that must hold for each."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import psutil

from pyvision_jax.agent.sandbox import Sandbox, SandboxConfig, SandboxPool

# A runtime in a fresh bubblewrap of its own, or a fork of a pool's template.
RUNTIME_KINDS = ("bubblewrap", "forked")


@contextlib.contextmanager
def sandbox_of_kind(config: SandboxConfig, kind: str) -> Iterator[Sandbox]:
    """A sandbox whose runtime is of `kind` (one of RUNTIME_KINDS), closed at the end."""
    if kind == "bubblewrap":
        with Sandbox(config) as box:
            assert not box.forked
            yield box
        return
    with SandboxPool(config, size=1) as pool:
        box = pool.acquire(timeout_s=120)
        assert box.forked, "this host must allow runtimes forked from a template"
        yield box


@dataclasses.dataclass
class Footprint:
    """The host processes of sandbox runtimes, to prove later that none survived.

    `pins` holds each PID namespace's file open: a namespace's number is freed for reuse only
    when nothing refers to it, so while the footprint lives no later namespace (another
    program's sandbox, say) can take the number of a dead one and look like a survivor."""

    processes: list[psutil.Process]
    namespaces: set[str]
    uids: frozenset[int]
    pins: list[Any] = dataclasses.field(default_factory=list)


def _pins(pids: list[int], namespaces: set[str]) -> list[Any]:
    """An open file of each of `namespaces`, through the first of `pids` in it."""
    pins, pinned = [], set()
    for pid in pids:
        namespace = pid_namespace(pid)
        if namespace in namespaces and namespace not in pinned:
            try:
                pins.append(open(f"/proc/{pid}/ns/pid", "rb"))  # noqa: SIM115 - closed with the footprint
            except OSError:
                continue
            if pid_namespace(pid) == namespace:
                pinned.add(namespace)
    return pins


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def process_footprint(pids: frozenset[int] | list[int]) -> Footprint:
    """The footprint of these host processes: their PID namespaces other than ours, and the
    uids (other than ours) they run as."""
    processes = [psutil.Process(pid) for pid in sorted(pids)]
    own = pid_namespace(os.getpid())
    namespaces = {ns for ns in (pid_namespace(p.pid) for p in processes) if ns not in (own, None)}
    uids = frozenset(p.uids().real for p in processes) - {os.getuid()}
    return Footprint(processes, namespaces, uids, _pins([p.pid for p in processes], namespaces))


def footprint(sandbox: Sandbox) -> Footprint:
    """The footprint of the sandbox's current runtime."""
    outer = psutil.Process(sandbox.pid)
    processes = [outer] + outer.children(recursive=True)
    own = pid_namespace(os.getpid())
    namespaces = {ns for ns in (pid_namespace(p.pid) for p in processes[1:]) if ns != own}
    assert namespaces or not sandbox.isolated, "an isolated runtime has its own PID namespace"
    uids = frozenset() if sandbox.uid is None else frozenset({sandbox.uid})
    return Footprint(processes, namespaces, uids, _pins([p.pid for p in processes[1:]], namespaces))


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that exits while it is being asked is gone."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def surviving(trace: Footprint, exclude: frozenset[int] = frozenset()) -> list[str]:
    """Processes of the footprint still alive; `exclude` is a later runtime whose new PID
    namespace may reuse the number of the dead one."""
    found = [f"pid {p.pid}" for p in trace.processes if _alive(p)]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in exclude and pid_namespace(int(entry)) in trace.namespaces:
            found.append(f"pid {entry} in the sandbox namespace")
    if trace.uids:
        for proc in psutil.process_iter(["uids"]):
            uids = proc.info["uids"]
            if uids is not None and trace.uids & {uids.real, uids.effective}:
                found.append(f"pid {proc.pid} running as a sandbox uid")
    return found


def assert_gone(trace: Footprint, grace_s: float = 20.0, exclude: frozenset[int] = frozenset()) -> None:
    deadline = time.monotonic() + grace_s
    while surviving(trace, exclude) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert surviving(trace, exclude) == []


def current_pids(sandbox: Sandbox) -> frozenset[int]:
    outer = psutil.Process(sandbox.pid)
    return frozenset([outer.pid] + [child.pid for child in outer.children(recursive=True)])


def descendants(pid: int | None = None) -> frozenset[int]:
    """Pids of all descendants of `pid` (default: this process)."""
    return frozenset(child.pid for child in psutil.Process(pid).children(recursive=True))
