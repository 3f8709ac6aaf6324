"""Kernel calls that isolate a forked runtime, through ctypes on libc: new namespaces and their
id maps, the private mounts of one runtime, its loopback interface, dropping capabilities, and
the seccomp filter.

Only the standard library is used, and nothing here runs after user code has started, so the
module keeps the ordinary builtins.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
RUNTIME_NAMESPACES = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# /proc entries bubblewrap also covers read-only: writing them reaches the whole machine.
_PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")

_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _prctl(option: int, *args: int) -> int:
    values = [ctypes.c_ulong(value) for value in (list(args) + [0, 0, 0, 0])[:4]]
    return _libc.prctl(option, *values)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare(0x{flags:x})")


def map_own_ids(uid: int, gid: int) -> None:
    """Maps `uid` and `gid` of the parent user namespace to themselves in the new one (the only
    mapping an unprivileged process may write for itself)."""
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"{gid} {gid} 1")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [None if value is None else value.encode() for value in (source, fstype, data)]
    _check(_libc.mount(encoded[0], target.encode(), encoded[1], ctypes.c_ulong(flags), encoded[2]), f"mount {target}")


def _bind_read_only(path: str) -> None:
    mount(path, path, None, MS_BIND | MS_REC)
    mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def mount_private_views(
    workdir: str, tmpfs_bytes: int, kept_in_workdir: list[str], media_source: str, media_target: str, hidden: list[str]
) -> None:
    """Gives the calling process (the first of a new PID and mount namespace) a /proc of its
    PID namespace, fresh tmpfs at `workdir` and /dev/shm, its own devpts, `media_source` bound
    at `media_target` (read-only, as its source), and covers each of `hidden` with an empty
    read-only tmpfs. Directories in `kept_in_workdir` (a Python installation under `workdir`)
    stay visible on top of the new tmpfs."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_COVERED:
        if os.path.exists(f"/proc/{name}"):
            _bind_read_only(f"/proc/{name}")
    kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for path in kept_in_workdir]
    mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777")
    for path, fd in kept:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={max(tmpfs_bytes // 4, 4096)},mode=1777")
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    mount(media_source, media_target, None, MS_BIND)
    for path in hidden:
        mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4096,mode=0555")


def bring_loopback_up() -> None:
    """Sets `lo` of the (new, empty) network namespace up, as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", _IFF_UP))


def drop_bounding_capabilities() -> None:
    """Empties the capability bounding set and the ambient set: nothing executed later can
    gain a capability. Needs CAP_SETPCAP; the effective capabilities stay until
    `clear_capabilities`."""
    for capability in range(64):
        if _prctl(_PR_CAPBSET_DROP, capability) != 0:
            number = ctypes.get_errno()
            if number == 22:  # EINVAL: past the last capability this kernel knows
                break
            raise OSError(number, f"dropping capability {capability}: {os.strerror(number)}")
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)


def clear_capabilities() -> None:
    """Clears the effective, permitted and inheritable capabilities of the calling thread."""
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def make_undumpable() -> None:
    """Makes the calling process untraceable by processes of its uid, and its /proc entries no
    longer theirs to open. Children forked later inherit it, so it is set after the fork."""
    _check(_prctl(_PR_SET_DUMPABLE, 0), "prctl(PR_SET_DUMPABLE)")


def install_seccomp(program: bytes) -> None:
    """Sets no_new_privs and installs the classic-BPF `program` (8 bytes per instruction) for
    the calling process and everything it starts later."""
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _check(_prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog)), "prctl(PR_SET_SECCOMP)")
