"""Runtimes forked from a pool's template: sibling episodes and the template stay out of each
other's reach, every fork has its limits, filter and no capabilities before any code runs, a
dead template is replaced, and where forks cannot get namespaces the pool warns once and
starts each runtime in a fresh bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from PIL import Image

from pyvision_jax.agent.sandbox import STATE_LOST_NOTICE, SandboxConfig, SandboxPool, fork_server
from pyvision_jax.agent.sandbox import sandbox as sandbox_module
from pyvision_jax.agent.sandbox.isolation import SANDBOX_WORKDIR, python_roots_in_workdir
from pyvision_jax.agent.sandbox.runtime.template import PRELOADED_MODULES
from tests.agent.sandbox_probes import assert_gone, descendants, footprint

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = SandboxConfig(
    timeout_s=20.0,
    memory_bytes=2 << 30,
    max_processes=48,
    max_file_bytes=32 << 20,
    cpu_seconds=300,
    max_open_files=2048,
)


@pytest.fixture
def pool():
    """A pool of its own per test: none outlives its test to fork while others count processes."""
    with SandboxPool(CONFIG, size=2) as pool:
        yield pool


def nspids(pid: int) -> list[int]:
    """The numbers of a process in each PID namespace it is in, outermost first (none once it
    has exited: a pool may be forking while it is listed)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            lines = handle.readlines()
    except OSError:
        return []
    (line,) = [line for line in lines if line.startswith("NSpid:")]
    return [int(number) for number in line.split()[1:]]


def template_processes(pool: SandboxPool) -> list[psutil.Process]:
    """The template's own processes: its bubblewrap, bubblewrap's first process in the new PID
    namespace and the template under it (the inits of forked runtimes, reparented there, are
    one namespace further down)."""
    outer = psutil.Process(pool.template_pid)
    depth = len(nspids(outer.pid)) + 1
    (first,) = outer.children()
    return [outer, first] + [p for p in first.children() if len(nspids(p.pid)) == depth]


def test_episodes_cannot_see_signal_or_read_each_other_or_the_template(pool):
    first, second = pool.acquire(timeout_s=120), pool.acquire(timeout_s=120)
    assert first.forked and second.forked
    first.preload_image("image_clue_0", Image.new("RGB", (8, 8), (1, 2, 3)))
    setup = first.run(
        textwrap.dedent("""\
        import ctypes, os, socket, subprocess
        open('/tmp/secret', 'w').write('first')
        open('/dev/shm/secret', 'w').write('first')
        pty = os.openpty()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind('\\0pyvision_secret')
        listener.listen()
        sleeper = subprocess.Popen(['sleep', '300'])
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5EED, 4096, 0o1600) >= 0, sorted(os.listdir('/media')))
        """)
    )
    assert setup.error is None and setup.stdout == "True ['image_clue_0.png']\n"
    template = psutil.Process(pool.template_pid)
    everything = {template.pid, os.getpid()} | {p.pid for p in template.children(recursive=True)}
    others = sorted({number for pid in everything for number in nspids(pid)} - {1, 2})
    probe = second.run(
        textwrap.dedent(f"""\
        import ctypes, os, socket
        print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
        reachable = []
        for pid in {others!r}:
            try:
                os.kill(pid, 0)
                reachable.append(pid)
            except ProcessLookupError:
                pass
        print(reachable)
        print([path for path in ['/tmp/secret', '/dev/shm/secret', '/media/image_clue_0.png']
               if os.path.exists(path)])
        print(sorted(os.listdir('/tmp')), os.listdir('/tmp/.matplotlib'), os.listdir('/dev/shm'),
              os.listdir('/dev/pts'), os.listdir('/media'), os.listdir('/opt/pyvision/sandboxes'))
        try:
            socket.socket(socket.AF_UNIX).connect('\\0pyvision_secret')
        except OSError as exc:
            print(type(exc).__name__)
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5EED, 4096, 0o600), ctypes.get_errno())
        """)
    )
    assert probe.error is None, probe.error
    # a checkout under /tmp keeps its Python installation visible on top of the private /tmp
    kept = {Path(root).relative_to(SANDBOX_WORKDIR).parts[0] for root in python_roots_in_workdir()}
    assert probe.stdout.splitlines() == [
        "[1, 2]",
        "[]",
        "[]",
        f"{sorted({'.matplotlib'} | kept)} [] [] ['ptmx'] [] []",
        "ConnectionRefusedError",
        "-1 2",
    ]
    # A signal to every process it may reach (all but itself and its init) reaches its own
    # child alone.
    own = template_processes(pool)
    assert len(own) == 3  # bubblewrap, its first process in the namespace, the template
    killed = second.run(
        "import os, signal, subprocess\nchild = subprocess.Popen(['sleep', '300'])\n"
        "os.kill(-1, signal.SIGKILL)\nprint(child.wait())"
    )
    assert killed.error is None and killed.stdout == "-9\n"
    assert first.run("print(open('/tmp/secret').read(), sleeper.poll())").stdout == "first None\n"
    assert all(process.is_running() for process in own)
    if first.uid is not None:  # root host: every runtime runs as a uid of its own
        assert first.uid != second.uid
    pool.release(first)
    pool.release(second)


def test_each_fork_has_its_limits_filter_and_no_capability_before_any_code(pool):
    box = pool.acquire(timeout_s=120)
    result = box.run(
        textwrap.dedent("""\
        import os, resource
        def status(pid):
            fields = dict(line.split(':', 1) for line in open(f'/proc/{pid}/status'))
            return [fields[name].strip() for name in ('Seccomp', 'NoNewPrivs', 'CapInh', 'CapPrm',
                                                      'CapEff', 'CapBnd', 'CapAmb')]
        print(status('self'))
        print(status(1))
        print([resource.getrlimit(getattr(resource, name))[1] for name in
               ('RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CPU', 'RLIMIT_NOFILE')])
        fds = {}
        for fd in os.listdir('/proc/self/fd'):
            try:
                fds[int(fd)] = os.readlink(f'/proc/self/fd/{fd}')
            except OSError:
                pass  # the directory listing's own
        print(sorted(fds), fds[0], len({fds[fd] for fd in (1, 2, 1019, 1020)}))
        """)
    )
    isolated = str(["2", "1"] + ["0000000000000000"] * 5)
    limits = [
        CONFIG.memory_bytes,
        CONFIG.max_processes,
        CONFIG.max_file_bytes,
        CONFIG.cpu_seconds,
        CONFIG.max_open_files,
    ]
    assert result.error is None, result.error
    # Nothing of the template's reaches it: stdin, the output capture, and its channel.
    assert result.stdout.splitlines() == [
        isolated,
        isolated,
        str(limits),
        "[0, 1, 2, 1019, 1020, 1021, 1022] /dev/null 1",
    ]
    pool.release(box)


def test_forks_draw_their_own_random_numbers(pool):
    boxes = [pool.acquire(timeout_s=120) for _ in range(2)]
    draws = [box.run("import random\nprint(np.random.rand(), random.random())").stdout for box in boxes]
    assert draws[0] != draws[1]
    for box in boxes:
        pool.release(box)


def test_forks_start_with_the_libraries_model_code_imports_already_imported(pool):
    # scipy.ndimage took 0.16-0.23 s to import in each runtime, and the toy's policies import it
    # in most tool calls (docs/performance.md, "Rollout throughput").
    box = pool.acquire(timeout_s=120)
    loaded = box.run(f"import sys\nprint([name for name in {PRELOADED_MODULES!r} if name not in sys.modules])")
    labels = box.run("from scipy import ndimage\nprint(ndimage.label(np.eye(3, dtype=bool))[1])")
    pool.release(box)
    assert "scipy.ndimage" in PRELOADED_MODULES
    assert (loaded.stdout, loaded.error) == ("[]\n", None)
    assert (labels.stdout, labels.error) == ("3\n", None)  # diagonal pixels: not 4-connected


def test_a_dead_template_takes_its_runtimes_along_and_is_restarted():
    with SandboxPool(CONFIG, size=1) as pool:
        box = pool.acquire(timeout_s=120)
        box.run("kept = 1")
        old_template = pool.template_pid
        trace = footprint(box)
        os.kill(old_template, signal.SIGKILL)
        assert_gone(trace, grace_s=30)
        crashed = box.run("print('kept' in globals())")
        assert crashed.error.startswith("SandboxCrash: ") and not crashed.timed_out
        result = box.run("print('kept' in globals())")
        assert result.state_lost and result.stdout == STATE_LOST_NOTICE + "False\n"
        assert box.forked and pool.template_pid not in (None, old_template)
        other = pool.acquire(timeout_s=120)
        assert other.forked and other.run("print(1)").stdout == "1\n"


def test_closing_a_pool_while_it_starts_leaves_no_process_and_no_directory(monkeypatch):
    """Only the directories these pools create count: other programs on the machine may have
    sandboxes of their own in the temp dir."""
    earlier_processes = descendants()
    created = []

    def recording(real):
        def create(*args, **kwargs):
            host_dir, owner_lock = real(*args, **kwargs)
            created.append(host_dir)
            return host_dir, owner_lock

        return create

    for module in (fork_server, sandbox_module):
        monkeypatch.setattr(module, "create_host_dir", recording(module.create_host_dir))
    for delay_s in (0.0, 0.2, 0.5, 1.0, 2.0):  # the template starting, then forks in flight
        pool = SandboxPool(CONFIG, size=4)
        time.sleep(delay_s)
        pool.close()
        deadline = time.monotonic() + 10
        while descendants() - earlier_processes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert descendants() - earlier_processes == frozenset()
    assert created and all(Path(tempfile.gettempdir()) in path.parents for path in created)
    assert [path for path in created if path.exists()] == []


NO_NESTED_NAMESPACES_BWRAP = """#!{python}
import os, sys
args = sys.argv[1:]
if "--template" in args:  # the template's forks get no namespaces of their own
    at = args.index("--chdir") + 2
    args[at:at] = ["--cap-drop", "ALL"] if os.geteuid() == 0 else ["--disable-userns"]
os.execv({bwrap!r}, [{bwrap!r}] + args)
"""

FALLBACK_SCRIPT = """
import json, sys, warnings
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
config = SandboxConfig(timeout_s=60.0, bwrap_path=sys.argv[1])
caught, outputs = [], []
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(2):
        with SandboxPool(config, size=1) as pool:
            box = pool.acquire(timeout_s=120)
            outputs.append([box.forked, box.run(
                "import os\\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
            ).stdout])
caught = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
print(json.dumps({"warnings": caught, "outputs": outputs}))
"""


def test_without_nested_namespaces_a_pool_warns_once_and_starts_fresh_bubblewraps(tmp_path):
    wrapper = tmp_path / "bwrap"
    wrapper.write_text(NO_NESTED_NAMESPACES_BWRAP.format(python=sys.executable, bwrap=shutil.which("bwrap")))
    wrapper.chmod(0o755)
    fresh = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(wrapper)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(fresh.stdout.splitlines()[-1])
    assert report["outputs"] == [[False, "[1, 2]\n"]] * 2
    assert len(report["warnings"]) == 1
    warning = report["warnings"][0]
    assert "\n" not in warning
    assert warning.startswith("sandbox runtimes cannot be forked from a template on this host")
    assert warning.endswith("each starts in a fresh bubblewrap instead")
