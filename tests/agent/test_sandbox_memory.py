"""One memory limit per sandbox: all the processes of one sandbox together are held to it (one
of them is killed and the call says so), its neighbours and the pool's template go on
unharmed, and each runtime's memory cgroup is gone once the runtime is; for runtimes in a
fresh bubblewrap and for runtimes forked from a pool's template alike."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pyvision_jax.agent.sandbox import Sandbox, SandboxConfig, SandboxPool, cgroups
from pyvision_jax.agent.sandbox.cgroups import MemoryHierarchy, candidate_hierarchies, find_memory_hierarchy
from tests.agent.sandbox_probes import RUNTIME_KINDS, footprint

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT_MIB = 768
# Each child fits the limit with a neighbour, and within its own address space (RLIMIT_AS of
# the same size, where a forked runtime already takes some 300 MiB); four of them do not fit.
CHILD_MIB = 240
CONFIG = SandboxConfig(timeout_s=120.0, memory_bytes=LIMIT_MIB << 20, startup_timeout_s=120.0)
HOLD = textwrap.dedent("""\
    import json, os, select, time
    def hold(n, mib):
        '''Forks n children that each fill `mib` MiB and keep it until all have answered;
        prints which of them held it at that moment and how each ended.'''
        ready_r, ready_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pids = []
        for index in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(stop_w)
                    block = bytearray(mib << 20)
                    block[::4096] = b"\\x01" * len(range(0, len(block), 4096))
                    os.write(ready_w, bytes([index]))
                    os.read(stop_r, 1)
                finally:
                    os._exit(0)
            pids.append(pid)
        os.close(ready_w)
        reported, exited = set(), {}
        deadline = time.monotonic() + 90
        while len(reported | set(exited)) < n and time.monotonic() < deadline:
            if select.select([ready_r], [], [], 0.1)[0]:
                reported.update(os.read(ready_r, n))
            for index, pid in enumerate(pids):
                if index not in exited:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        exited[index] = os.waitstatus_to_exitcode(status)
        holding = sorted(reported - set(exited))
        os.close(stop_w)
        for index, pid in enumerate(pids):
            if index not in exited:
                exited[index] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(json.dumps({"holding": holding, "exits": [exited[i] for i in range(n)]}))
    """)


def hierarchy() -> MemoryHierarchy:
    found, reason = find_memory_hierarchy()
    assert found is not None, f"this host must allow memory cgroups ({reason})"
    return found


@contextlib.contextmanager
def two_sandboxes(kind: str) -> Iterator[tuple[Sandbox, Sandbox, SandboxPool | None]]:
    """Two sandboxes whose runtimes are of `kind`, and their pool (None for bubblewrap)."""
    if kind == "bubblewrap":
        with Sandbox(CONFIG) as first, Sandbox(CONFIG) as second:
            assert not first.forked and not second.forked
            yield first, second, None
        return
    with SandboxPool(CONFIG, size=2) as pool:
        first, second = pool.acquire(timeout_s=120), pool.acquire(timeout_s=120)
        assert first.forked and second.forked, "this host must allow forked runtimes"
        yield first, second, pool


def own_cgroups(found: MemoryHierarchy) -> list[str]:
    """The sandbox cgroups this process has now."""
    if not found.parent.is_dir():
        return []
    return sorted(path.name for path in found.parent.iterdir() if path.name.startswith(f"sandbox-{os.getpid()}-"))


def runtime_cgroup(found: MemoryHierarchy, box: Sandbox) -> Path:
    """The cgroup of the sandbox's runtime, checked to hold every process of it."""
    cgroup = found.cgroup_of(box.pid)
    assert cgroup is not None and cgroup.parent == found.parent
    for process in footprint(box).processes:
        assert found.cgroup_of(process.pid) == cgroup
    return cgroup


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_the_processes_of_one_sandbox_share_its_memory_limit(kind):
    hierarchy()
    with two_sandboxes(kind) as (box, neighbour, pool):
        template = None if pool is None else psutil.Process(pool.template_pid)
        assert neighbour.run("kept = 41").error is None

        two = box.run(HOLD + f"hold(2, {CHILD_MIB})")
        assert two.error is None, two.error
        assert json.loads(two.stdout) == {"holding": [0, 1], "exits": [0, 0]}

        four = box.run(HOLD + f"hold(4, {CHILD_MIB})")
        exceeded = f"the sandbox's processes together reached its memory limit of {LIMIT_MIB} MiB"
        if four.stdout:  # the kernel killed children; else it chose the runtime itself
            report = json.loads(four.stdout)
            assert len(report["holding"]) * CHILD_MIB <= LIMIT_MIB
            assert -9 in report["exits"]
            assert four.error is not None and four.error.startswith(f"MemoryError: {exceeded}")
        else:
            assert four.error is not None and four.error.startswith("SandboxCrash")
            assert exceeded in four.error

        again = box.run("print('again')")
        assert again.error is None and again.stdout.endswith("again\n")
        kept = neighbour.run("print(kept + 1)")
        assert not kept.state_lost and kept.stdout == "42\n"
        if template is not None:
            assert template.is_running() and pool.template_pid == template.pid


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_each_runtime_has_a_cgroup_of_its_own_that_goes_with_it(kind):
    found = hierarchy()
    with two_sandboxes(kind) as (box, neighbour, pool):
        # Before any code runs, the runtime and all its processes are in a cgroup of their
        # own, limited to the sandbox's memory.
        first = runtime_cgroup(found, box)
        limit_file = "memory.max" if found.version == 2 else "memory.limit_in_bytes"
        assert int((first / limit_file).read_text()) == LIMIT_MIB << 20
        assert runtime_cgroup(found, neighbour) != first
        assert box.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").error
        assert not first.exists()
        assert box.run("print(1)").state_lost
        second = runtime_cgroup(found, box)
        assert second != first
        # A child that outlives its call is in the sandbox's cgroup, and dies with it.
        started = box.run(
            "import subprocess\nchild = subprocess.Popen(['sleep', '300'], start_new_session=True)\nprint('started')"
        )
        assert started.stdout.endswith("started\n")
        assert "sleep" in [process.name() for process in footprint(box).processes]
        assert runtime_cgroup(found, box) == second
        if pool is not None:
            pool.release(box)
    assert own_cgroups(found) == []
    assert not second.exists()


OWNER_SCRIPT = """
import json, time
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
from pyvision_jax.agent.sandbox.cgroups import find_memory_hierarchy
pool = SandboxPool(SandboxConfig(timeout_s=120), size=1)
box = pool.acquire(timeout_s=120)
print(json.dumps(str(find_memory_hierarchy()[0].cgroup_of(box.pid))), flush=True)
time.sleep(300)
"""


def test_the_cgroups_of_an_owner_killed_outright_are_swept_by_the_next_pool():
    found = hierarchy()
    owner = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT], stdout=subprocess.PIPE, cwd=REPO_ROOT, text=True)
    try:
        left = Path(json.loads(owner.stdout.readline()))
        owner.kill()
        owner.wait(timeout=30)
        assert left.parent == found.parent and left.is_dir()
        deadline = time.monotonic() + 30  # its runtimes die with it, a moment later
        while (left / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        with SandboxPool(CONFIG, size=1):
            assert not left.exists()
            assert not [path for path in found.parent.iterdir() if path.name.startswith(f"sandbox-{owner.pid}-")]
    finally:
        owner.kill()
        owner.wait()


def test_without_memory_cgroups_a_pool_warns_once_that_its_limit_is_per_process(monkeypatch):
    monkeypatch.setattr(cgroups, "find_memory_hierarchy", lambda: (None, "v1: Read-only file system"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = SandboxPool(dataclasses.replace(CONFIG, fork_runtimes=False), size=1)
    with pool:
        box = pool.acquire(timeout_s=120)
        assert box.run("print(1)").stdout == "1\n"
        assert hierarchy().cgroup_of(box.pid) == hierarchy().cgroup_of(os.getpid())
    messages = [str(w.message) for w in caught if "sandbox memory" in str(w.message)]
    assert messages == [
        f"sandbox memory is limited per process only ({LIMIT_MIB} MiB of "
        f"address space each; no memory cgroup: v1: Read-only file system): "
        f"the processes of one sandbox can together use more"
    ]


HYBRID_CGROUP = "4:memory:/jobs/trainer\n1:cpu:/jobs/trainer\n0::/\n"
HYBRID_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 /jobs /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)


def test_hierarchies_are_found_from_proc_v2_first_and_inside_a_mount_root():
    assert candidate_hierarchies(HYBRID_CGROUP, HYBRID_MOUNTS) == [
        (2, Path("/sys/fs/cgroup/unified"), "/", Path("/sys/fs/cgroup/unified")),
        (1, Path("/sys/fs/cgroup/memory"), "/jobs", Path("/sys/fs/cgroup/memory/trainer")),
    ]
    unified = "0::/user.slice/run.scope\n"
    mounts = "29 23 0:26 / /mnt/cgroup\\040two rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert candidate_hierarchies(unified, mounts) == [
        (2, Path("/mnt/cgroup two"), "/", Path("/mnt/cgroup two/user.slice/run.scope"))
    ]
    # A process outside the mounted part of the hierarchy has no cgroup there.
    assert candidate_hierarchies(unified, mounts.replace(" / ", " /mine ")) == []
