"""How a runtime is isolated: which mode this host allows, and the bubblewrap commands that
build a sandbox or a pool's template (namespaces, capabilities, the read-only view of the
system and of the Python installation, the private tmpfs and the media).

The layout inside the sandbox: the runtime package under SANDBOX_RUNTIME_DIR, the preloaded
media (read-only) under SANDBOX_MEDIA, the host-built font cache under SANDBOX_FONT_CACHE, and
a private tmpfs at SANDBOX_WORKDIR as the only writable place. A template sees the host
directories of all its pool's sandboxes under SANDBOX_HOSTS; each fork binds its own media
from there to SANDBOX_MEDIA and covers SANDBOX_HOSTS.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxUnavailableError

RUNTIME_DIR = Path(__file__).with_name("runtime")
RUNTIME_ENTRY = "__main__.py"
SANDBOX_ROOT = "/opt/pyvision"
SANDBOX_RUNTIME_DIR = f"{SANDBOX_ROOT}/{RUNTIME_DIR.name}"
SANDBOX_MEDIA = "/media"
SANDBOX_FONT_CACHE = f"{SANDBOX_ROOT}/matplotlib"
SANDBOX_WORKDIR = "/tmp"
SANDBOX_HOSTS = f"{SANDBOX_ROOT}/sandboxes"
# What a template's forks need of root (root mode only): new namespaces and their mounts
# (SYS_ADMIN), the loopback of their network namespace (NET_ADMIN), emptying their bounding
# set (SETPCAP) and the drop to their own uid (SETUID, SETGID). Each fork gives them all up
# before model code runs.
TEMPLATE_ROOT_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETPCAP", "CAP_SETUID", "CAP_SETGID")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/fonts",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/mime.types",
)

_unisolated_warned = False
_unisolated_warned_lock = threading.Lock()


def isolation_mode(config: SandboxConfig) -> tuple[str, str | None]:
    """("root" | "userns", bwrap path) with bubblewrap, else ("unisolated", None).

    Without bubblewrap: SandboxUnavailableError unless the config allows unisolated runtimes,
    in which case it warns once per process."""
    global _unisolated_warned
    bwrap = config.bwrap_path or shutil.which("bwrap")
    if bwrap and os.access(bwrap, os.X_OK):
        return ("root" if os.geteuid() == 0 else "userns"), bwrap
    if not config.allow_unisolated:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed, so model-written code cannot be isolated; "
            "install the Debian package 'bubblewrap' or set "
            "SandboxConfig(allow_unisolated=True) to run it without isolation"
        )
    with _unisolated_warned_lock:
        if not _unisolated_warned:
            _unisolated_warned = True
            warnings.warn(
                "bubblewrap is not installed: sandboxes run model-written code "
                "WITHOUT isolation (allow_unisolated=True)",
                RuntimeWarning,
                stacklevel=3,
            )
    return "unisolated", None


def runtime_environment(workdir: str) -> dict[str, str]:
    """The environment variables of a runtime whose home and temp dir is `workdir`."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "MPLCONFIGDIR": f"{workdir}/.matplotlib",
        "XDG_CACHE_HOME": f"{workdir}/.cache",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }


def _python_roots() -> list[str]:
    """Directories the sandboxed interpreter needs, outermost first, without duplicates."""
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    ]
    candidates += [os.path.realpath(path) for path in candidates]
    roots: list[str] = []
    for path in sorted(set(map(os.path.normpath, candidates)), key=len):
        if path in ("/", "/usr") or not os.path.isdir(path):
            continue
        if not any(path == root or path.startswith(root + "/") for root in roots + ["/usr"]):
            roots.append(path)
    return roots


def _bind_with_parents(args: list[str], source: str, target: str, made: set[str]) -> None:
    parents = []
    parent = os.path.dirname(target)
    while parent not in ("/", ""):
        parents.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(parents):
        if directory not in made:
            made.add(directory)
            args += ["--perms", "0755", "--dir", directory]
    args += ["--ro-bind", source, target]


def python_roots_in_workdir() -> list[str]:
    """The directories of the Python installation that lie under SANDBOX_WORKDIR (a checkout
    in /tmp), which must stay visible on top of a runtime's private tmpfs there."""
    return [root for root in _python_roots() if root.startswith(SANDBOX_WORKDIR + "/")]


def _bwrap_args(
    bwrap: str,
    config: SandboxConfig,
    mode: str,
    capabilities: tuple[str, ...],
    info_fd: int,
    seccomp_fd: int | None,
    font_cache: str | None,
    binds: list[tuple[str, str]],
    empty_dirs: tuple[str, ...],
) -> list[str]:
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
    ]
    if mode == "root":
        for capability in capabilities:
            args += ["--cap-add", capability]
    else:
        args += ["--unshare-user"]
    args += ["--hostname", "sandbox", "--clearenv", "--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    for name, value in runtime_environment(SANDBOX_WORKDIR).items():
        args += ["--setenv", name, value]
    # The private /tmp comes before the binds: a Python installation that lives under /tmp
    # (a checkout there) is then bound on top of it instead of being hidden by it.
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(config.tmpfs_bytes // 4),
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "1777",
        "--size",
        str(config.tmpfs_bytes),
        "--tmpfs",
        SANDBOX_WORKDIR,
    ]
    args += ["--ro-bind", "/usr", "/usr"]
    made: set[str] = {"/usr", "/dev", "/proc", SANDBOX_WORKDIR}
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_FILES:
        if os.path.exists(path):
            _bind_with_parents(args, path, path, made)
    for root in _python_roots():
        _bind_with_parents(args, root, root, made)
    _bind_with_parents(args, str(RUNTIME_DIR), SANDBOX_RUNTIME_DIR, made)
    for source, target in binds:
        _bind_with_parents(args, source, target, made)
    if font_cache is not None:
        _bind_with_parents(args, font_cache, SANDBOX_FONT_CACHE, made)
    for directory in empty_dirs:
        args += ["--perms", "0755", "--dir", directory]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR]
    return args


def bwrap_command(
    bwrap: str,
    config: SandboxConfig,
    mode: str,
    media_dir: str,
    info_fd: int,
    font_cache: str | None,
    seccomp_fd: int | None,
) -> list[str]:
    """The bubblewrap command line (up to the program it runs) of one sandbox."""
    return _bwrap_args(
        bwrap,
        config,
        mode,
        ("CAP_SETUID", "CAP_SETGID"),
        info_fd,
        seccomp_fd,
        font_cache,
        [(media_dir, SANDBOX_MEDIA)],
        (),
    )


def template_bwrap_command(
    bwrap: str, config: SandboxConfig, mode: str, hosts_dir: str, info_fd: int, font_cache: str | None
) -> list[str]:
    """The bubblewrap command line (up to the program it runs) of a pool's template: the
    sandbox of one runtime, but with `hosts_dir` (the host directories of the pool's
    sandboxes) at SANDBOX_HOSTS, an empty SANDBOX_MEDIA, no seccomp filter (its forks make
    namespaces, then install it) and, as root, TEMPLATE_ROOT_CAPABILITIES. Without root its
    forks make a user namespace of their own and need no capability of bubblewrap's."""
    return _bwrap_args(
        bwrap,
        config,
        mode,
        TEMPLATE_ROOT_CAPABILITIES,
        info_fd,
        None,
        font_cache,
        [(hosts_dir, SANDBOX_HOSTS)],
        (SANDBOX_MEDIA,),
    )
