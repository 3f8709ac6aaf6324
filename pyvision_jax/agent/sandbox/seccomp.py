"""The seccomp filter of sandboxed runtimes."""

from __future__ import annotations

import errno
import platform
import struct

# Linux syscall numbers and audit arch per machine, for the seccomp filter below.
_SECCOMP_ARCHES = {
    "x86_64": {"arch": 0xC000003E, "unshare": 272, "clone": 56, "clone3": 435, "setns": 308},
    "aarch64": {"arch": 0xC00000B7, "unshare": 97, "clone": 220, "clone3": 435, "setns": 268},
}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000


def seccomp_program() -> bytes | None:
    """A classic-BPF seccomp filter that stops sandboxed code from creating user namespaces
    (the way to regain capabilities, and a large kernel attack surface) and from using other
    syscall ABIs; None on machines it does not know. clone3 answers ENOSYS so that libc falls
    back to clone, whose flags the filter can inspect."""
    numbers = _SECCOMP_ARCHES.get(platform.machine())
    if numbers is None:
        return None
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno_base = 0x7FFF0000, 0x00050000
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved below.
    program = [
        (load, None, None, 4),
        (jeq, None, "enosys", numbers["arch"]),
        (load, None, None, 0),
        (jge, "enosys", None, _X32_SYSCALL_BIT),
        (jeq, "enosys", None, numbers["clone3"]),
        (jeq, "flags", None, numbers["unshare"]),
        (jeq, "flags", None, numbers["clone"]),
        (jeq, "eperm", None, numbers["setns"]),
        (ret, None, None, allow),
        ("flags", None, None, None),
        (load, None, None, 16),
        (jset, "eperm", None, _CLONE_NEWUSER),
        (ret, None, None, allow),
        ("eperm", None, None, None),
        (ret, None, None, errno_base | errno.EPERM),
        ("enosys", None, None, None),
        (ret, None, None, errno_base | errno.ENOSYS),
    ]
    labels, instructions = {}, []
    for entry in program:
        if isinstance(entry[0], str):
            labels[entry[0]] = len(instructions)
        else:
            instructions.append(entry)
    encoded = []
    for index, (code, if_true, if_false, k) in enumerate(instructions):
        jump_true = labels[if_true] - index - 1 if if_true else 0
        jump_false = labels[if_false] - index - 1 if if_false else 0
        encoded.append(struct.pack("<HBBI", code, jump_true, jump_false, k))
    return b"".join(encoded)
