"""One memory limit per sandbox: a runtime and every process it starts share a memory cgroup of
their own, limited to `SandboxConfig.memory_bytes` for all of them together (their files in
the sandbox's tmpfs included).

The cgroups are children of a parent cgroup PARENT_NAME inside this process's own cgroup, so
the sandboxes' memory also counts against whatever limits the owner has. The first of these
that this process can use is taken (found once per process):

- cgroup v2 with the memory controller: `memory.max` is the limit, `memory.swap.max` is 0. The
  owner's cgroup must hand the controller to its children (`+memory` in its
  `cgroup.subtree_control`), which the kernel allows in the root cgroup (an owner at the top of
  its machine or VM) but not in another cgroup that holds processes itself.
- cgroup v1 with the memory controller: `memory.limit_in_bytes`, and
  `memory.memsw.limit_in_bytes` (memory and swap together) where swap is accounted, else
  `memory.swappiness` 0.

When the sandbox's processes together reach the limit, the kernel reclaims what it can, then
kills the largest of them (an out-of-memory kill); `MemoryCgroup.oom_kills` counts those, so
that the call's result can say so. Each process also keeps RLIMIT_AS of `memory_bytes`, so one
oversized allocation fails with MemoryError instead.

Fallback: where no hierarchy is usable (not root, a read-only or missing cgroup filesystem, no
memory controller, a v2 cgroup that cannot delegate it), memory is limited per process only,
by RLIMIT_AS: several processes of one sandbox can then together take a multiple of
`memory_bytes`. A pool says so in a one-line warning when it is made (a sandbox outside a pool
once per process).

A cgroup is removed once its runtime is dead (any process still in it is killed first), and
the parent once it has no child left; cgroups left by owners that died (their runtimes die
with them) are removed when the next pool (or sandbox outside a pool) is made.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import re
import secrets
import signal
import threading
import time
import warnings
from pathlib import Path

import psutil

PARENT_NAME = "pyvision_sandboxes"
# A cgroup is named sandbox-<owner pid>-<owner token>-<number>: the token tells this process
# from an earlier owner that had its pid.
_OWNER_TOKEN = secrets.token_hex(4)
_CHILD_NAME = re.compile(r"sandbox-(\d+)-([0-9a-f]+)-\d+")
_REMOVE_WAIT_S = 10.0
_KERNEL_LISTS_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class MemoryHierarchy:
    """A cgroup hierarchy with the memory controller (version 1 or 2), mounted at `mount_point`
    with the cgroup `mount_root` there, and the `parent` of the sandboxes' cgroups in it."""

    version: int
    mount_point: Path
    mount_root: str
    parent: Path

    def directory(self, cgroup_path: str) -> Path | None:
        """The directory of a cgroup path as /proc/<pid>/cgroup names it (None: not under
        this mount)."""
        return _directory(self.mount_point, self.mount_root, cgroup_path)

    def cgroup_of(self, pid: int) -> Path | None:
        """The directory of the cgroup process `pid` is in, in this hierarchy."""
        with open(f"/proc/{pid}/cgroup") as handle:
            memberships = parse_proc_cgroup(handle.read())
        for hierarchy_id, controllers, path in memberships:
            if (self.version == 2 and hierarchy_id == "0") or (self.version == 1 and "memory" in controllers):
                return self.directory(path)
        return None


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (spaces and the like) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _directory(mount_point: Path, mount_root: str, cgroup_path: str) -> Path | None:
    root = mount_root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    return mount_point / cgroup_path[len(root) :].lstrip("/")


def parse_proc_cgroup(text: str) -> list[tuple[str, list[str], str]]:
    """The (hierarchy id, controllers, cgroup path) lines of a /proc/<pid>/cgroup."""
    memberships = []
    for line in text.splitlines():
        hierarchy_id, controllers, path = line.split(":", 2)
        memberships.append((hierarchy_id, [name for name in controllers.split(",") if name], path))
    return memberships


def candidate_hierarchies(proc_cgroup: str, mountinfo: str) -> list[tuple[int, Path, str, Path]]:
    """The memory-capable mounts this process is in, v2 first: (version, mount point, mount
    root, the directory of this process's own cgroup), from /proc/self/cgroup and
    /proc/self/mountinfo. A v2 mount is listed whether or not it has the memory controller."""
    memberships = parse_proc_cgroup(proc_cgroup)
    own_v2 = next((path for hierarchy_id, _, path in memberships if hierarchy_id == "0"), None)
    own_v1 = next((path for _, controllers, path in memberships if "memory" in controllers), None)
    found: list[tuple[int, Path, str, Path]] = []
    for line in mountinfo.splitlines():
        if " - " not in line:
            continue
        mount_fields, super_fields = line.split(" - ", 1)
        fields, extra = mount_fields.split(), super_fields.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        fstype, options = extra[0], extra[2].split(",")
        if fstype == "cgroup2" and own_v2 is not None:
            version, own = 2, own_v2
        elif fstype == "cgroup" and "memory" in options and own_v1 is not None:
            version, own = 1, own_v1
        else:
            continue
        directory = _directory(point, root, own)
        if directory is not None:
            found.append((version, point, root, directory))
    found.sort(key=lambda entry: -entry[0])
    return found


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _descendants(pid: int) -> set[int]:
    """Every descendant of process `pid`, from the kernel's list of each thread's children
    (a scan of all processes where the kernel keeps none)."""
    if not _KERNEL_LISTS_CHILDREN:
        try:
            return {child.pid for child in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # it has exited
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as handle:
                    children = {int(child) for child in handle.read().split()} - found
            except OSError:
                continue
            found |= children
            pending.extend(children)
    return found


def _owner_alive(pid: int, token: str) -> bool:
    if pid == os.getpid():
        return token == _OWNER_TOKEN
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class MemoryCgroup:
    """The memory cgroup of one runtime, made with its limit of `limit_bytes`: the processes put
    in it and every process they start share that limit."""

    _counter = itertools.count()

    def __init__(self, hierarchy: MemoryHierarchy, limit_bytes: int):
        self.hierarchy = hierarchy
        name = f"sandbox-{os.getpid()}-{_OWNER_TOKEN}-{next(MemoryCgroup._counter)}"
        self.path = hierarchy.parent / name
        for attempt in range(3):  # another owner may remove the empty parent meanwhile
            _prepare_parent(hierarchy)
            try:
                self.path.mkdir(mode=0o755)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            if hierarchy.version == 2:
                _write(self.path / "memory.max", str(limit_bytes))
                if (self.path / "memory.swap.max").exists():
                    _write(self.path / "memory.swap.max", "0")
            else:
                _write(self.path / "memory.limit_in_bytes", str(limit_bytes))
                if (self.path / "memory.memsw.limit_in_bytes").exists():
                    _write(self.path / "memory.memsw.limit_in_bytes", str(limit_bytes))
                else:
                    _write(self.path / "memory.swappiness", "0")
        except BaseException:
            self.remove()
            raise

    def add(self, pid: int) -> None:
        """Moves process `pid` (all its threads) into the cgroup."""
        _write(self.path / "cgroup.procs", str(pid))

    def add_tree(self, pid: int) -> None:
        """Moves process `pid` and all its descendants into the cgroup; those they start
        afterwards are born in it."""
        moved: set[int] = set()
        pending = {pid}
        while pending:
            for member in sorted(pending):
                self.add(member)
            moved |= pending
            pending = _descendants(pid) - moved

    def entering_command(self) -> list[str]:
        """A command prefix that moves itself into the cgroup, then executes the rest."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def oom_kills(self) -> int:
        """How many of its processes the kernel has killed for reaching the limit."""
        name = "memory.events" if self.hierarchy.version == 2 else "memory.oom_control"
        try:
            with open(self.path / name) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def _kill_members(self) -> None:
        kill_file = self.path / "cgroup.kill"
        if self.hierarchy.version == 2 and kill_file.exists():
            _write(kill_file, "1")
            return
        with open(self.path / "cgroup.procs") as handle:
            members = [int(line) for line in handle if line.strip()]
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Removes the cgroup (killing any process still in it) and the parent if it is left
        empty; warns if the kernel keeps it busy for longer than _REMOVE_WAIT_S seconds."""
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while True:
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    warnings.warn(
                        f"the memory cgroup {self.path} could not be removed ({exc})", RuntimeWarning, stacklevel=2
                    )
                    return
            try:
                self._kill_members()
            except OSError:
                pass
            time.sleep(0.02)
        try:
            os.rmdir(self.hierarchy.parent)
        except OSError:
            pass  # other sandboxes' cgroups are in it, or another owner removed it


def _prepare_parent(hierarchy: MemoryHierarchy) -> None:
    """Makes the parent cgroup if it is missing (with the memory controller for its children
    in v2)."""
    hierarchy.parent.mkdir(mode=0o755, exist_ok=True)
    if hierarchy.version == 2:
        control = hierarchy.parent / "cgroup.subtree_control"
        if "memory" not in control.read_text().split():
            _write(control, "+memory")


def _usable(version: int, point: Path, root: str, own: Path) -> MemoryHierarchy:
    """The hierarchy if a sandbox cgroup can be made in it (one is made and removed); raises
    OSError or ValueError saying why not."""
    if version == 2:
        if "memory" not in (own / "cgroup.controllers").read_text().split():
            raise ValueError(f"cgroup v2 at {point} has no memory controller here")
        control = own / "cgroup.subtree_control"
        if "memory" not in control.read_text().split():
            _write(control, "+memory")
    hierarchy = MemoryHierarchy(version, point, root, own / PARENT_NAME)
    MemoryCgroup(hierarchy, 64 * _MIB).remove()
    return hierarchy


def sweep_abandoned_cgroups(hierarchy: MemoryHierarchy) -> None:
    """Removes the (empty) sandbox cgroups of owners that are no longer alive."""
    try:
        children = list(hierarchy.parent.iterdir())
    except OSError:
        return
    for child in children:
        match = _CHILD_NAME.fullmatch(child.name)
        if match is None or not child.is_dir() or _owner_alive(int(match.group(1)), match.group(2)):
            continue
        try:
            os.rmdir(child)
        except OSError:
            pass  # it still has processes


_found_lock = threading.Lock()
_found: tuple[MemoryHierarchy | None, str] | None = None


def find_memory_hierarchy() -> tuple[MemoryHierarchy | None, str]:
    """The hierarchy this process makes sandbox cgroups in, found on the first call; (None,
    why not) where there is none."""
    global _found
    with _found_lock:
        if _found is not None:
            return _found
        reasons = []
        try:
            with open("/proc/self/cgroup") as handle:
                proc_cgroup = handle.read()
            with open("/proc/self/mountinfo") as handle:
                mountinfo = handle.read()
            candidates = candidate_hierarchies(proc_cgroup, mountinfo)
        except (OSError, ValueError) as exc:
            candidates, reasons = [], [f"cgroups unreadable: {exc}"]
        hierarchy = None
        for version, point, root, own in candidates:
            try:
                hierarchy = _usable(version, point, root, own)
                break
            except (OSError, ValueError) as exc:
                reasons.append(f"v{version}: {exc}")
        _found = (hierarchy, "; ".join(reasons) or "no cgroup hierarchy with a memory controller")
        return _found


class SandboxMemory:
    """How the runtimes of a pool (or of one sandbox) are held to `limit_bytes`: a memory cgroup
    each where this process can make them (`new_cgroup`), else RLIMIT_AS per process alone."""

    _standalone_warned = False

    def __init__(self, limit_bytes: int, warn: bool):
        self.limit_bytes = limit_bytes
        self.hierarchy, reason = find_memory_hierarchy()
        if self.hierarchy is not None:
            sweep_abandoned_cgroups(self.hierarchy)
        elif warn:
            warnings.warn(
                f"sandbox memory is limited per process only ({limit_bytes // _MIB} "
                f"MiB of address space each; no memory cgroup: {reason}): the "
                f"processes of one sandbox can together use more",
                RuntimeWarning,
                stacklevel=3,
            )

    @classmethod
    def for_pool(cls, limit_bytes: int) -> SandboxMemory:
        """The memory of a pool's sandboxes; warns if it is per process only."""
        return cls(limit_bytes, warn=True)

    @classmethod
    def for_sandbox(cls, limit_bytes: int) -> SandboxMemory:
        """The memory of a sandbox outside a pool; the first of these in a process warns if
        it is per process only."""
        warn, cls._standalone_warned = not cls._standalone_warned, True
        return cls(limit_bytes, warn=warn)

    def new_cgroup(self) -> MemoryCgroup | None:
        """A fresh cgroup for one runtime, or None where memory is limited per process."""
        return None if self.hierarchy is None else MemoryCgroup(self.hierarchy, self.limit_bytes)
