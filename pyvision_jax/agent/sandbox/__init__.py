"""Isolated, persistent Python runtimes for model-written code, and a warm pool of them.

A `Sandbox` owns one runtime process (the `runtime` package) started inside bubblewrap: its own
PID, network (loopback included), IPC and UTS namespaces, a read-only view of the system and
of the Python installation, a size-limited private tmpfs at /tmp as the only writable place,
and the preloaded media under /media (read-only). Hard rlimits bound address space, processes,
file size and CPU seconds; a seccomp filter forbids new user namespaces. All the processes of
one runtime share one memory limit, a memory cgroup of their own (v2, else v1) entered before
any model code runs and removed with the runtime; where the host allows none, memory is limited
per process only, and a pool warns so. Running as root, the runtime drops to a uid of its own
(picked at random per runtime) so that file permissions and the process limit apply to it;
otherwise bubblewrap's user namespace does the same.

A `SandboxPool` forks its runtimes instead: one template per pool (in bubblewrap as above)
imports the runtime's libraries once, and each runtime is a fork of it that enters PID, mount,
IPC, network, UTS and cgroup namespaces of its own (and a user namespace of its own without
root), with a /proc of its namespace, its own tmpfs at /tmp and /dev/shm, its own devpts and
only its sandbox's media, and gets its limits, the seccomp filter and no capabilities before
any model code runs. A dead template is restarted. Where nested namespaces are unavailable the
pool warns once and starts each runtime in a fresh bubblewrap.

Sandboxes die with their owner: on close, at exit, on SIGTERM (a handler is installed when
none is), and even on SIGKILL (bubblewrap's --die-with-parent, which takes a template's forks
along, and the runtime exits when its request pipe closes). Copied media of owners that died
are swept by the next owner.

Calls are synchronous frames over two pipes, numbered so that a reply can only answer the
request it was sent for. A call that overruns its wall-clock timeout kills the whole runtime
(the sandbox's PID namespace, so threads and children die with it); the next call runs in a
fresh runtime, with the preloaded media restored, and its result has `state_lost=True` and
starts with `STATE_LOST_NOTICE`.

Modules: `config` (SandboxConfig), `errors`, `results` (RunResult and reading replies),
`isolation` (bubblewrap commands), `seccomp`, `uids`, `cgroups` (memory cgroups),
`font_cache`, `channel` (host side of the frames), `launcher` and `launched` (a process tree
started in bubblewrap), `process` (a runtime in a bubblewrap of its own), `template`, `forked`
and `fork_server` (a pool's template, a runtime forked from it, and the pool's side of both),
`registry` (shutdown hooks), `host_dirs` and `media` (copied media on the host), `sandbox`
(Sandbox), `pool` (SandboxPool), and `runtime`, the package that runs inside the sandbox.
"""

from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from pyvision_jax.agent.sandbox.pool import SandboxPool
from pyvision_jax.agent.sandbox.results import STATE_LOST_NOTICE, TRUNCATION_MARKER, RunResult
from pyvision_jax.agent.sandbox.sandbox import Sandbox

__all__ = [
    "STATE_LOST_NOTICE",
    "TRUNCATION_MARKER",
    "RunResult",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPool",
    "SandboxStartError",
    "SandboxUnavailableError",
]
