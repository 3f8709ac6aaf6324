"""Hostile code: every case returns a clear RunResult within timeout + 2 s, leaves no
process behind, and leaves the host and the next sandbox unaffected; for runtimes in a fresh
bubblewrap and for runtimes forked from a pool's template alike."""

from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from pyvision_jax.agent.sandbox import STATE_LOST_NOTICE, RunResult, Sandbox, SandboxConfig
from tests.agent.sandbox_probes import RUNTIME_KINDS, assert_gone, current_pids, footprint, sandbox_of_kind

KILL_CONFIG = SandboxConfig(
    timeout_s=2.0,
    max_stdout_bytes=1000,
    memory_bytes=1 << 30,
    max_processes=32,
    max_file_bytes=16 << 20,
    tmpfs_bytes=64 << 20,
    max_images_per_call=8,
)
# Cases the runtime survives get a generous timeout: on a loaded machine they must not be
# stopped by it, since what they check is the answer of the runtime itself.
SURVIVE_CONFIG = dataclasses.replace(KILL_CONFIG, timeout_s=30.0)


@pytest.fixture(scope="module", params=RUNTIME_KINDS)
def kind(request):
    """Every case runs against both kinds of runtime."""
    return request.param


@pytest.fixture(scope="module")
def victim(kind):
    """One sandbox killed by every case that must end its runtime; each next call restarts it."""
    with sandbox_of_kind(KILL_CONFIG, kind) as box:
        yield box


@pytest.fixture(scope="module")
def survivor(kind):
    """One sandbox shared by the cases its runtime must survive, one after the other."""
    with sandbox_of_kind(SURVIVE_CONFIG, kind) as box:
        yield box


def run_contained(box: Sandbox, code: str, *, killed: bool) -> RunResult:
    """Runs `code` and checks the properties every case needs: a result within timeout + 2 s;
    if `killed`, none of the runtime's processes left and the next call in a fresh runtime
    that says so; otherwise the runtime and its state intact."""
    box.run("canary = 'alive'")
    before = footprint(box)
    start = time.monotonic()
    result = box.run(code)
    elapsed = time.monotonic() - start
    assert elapsed < box.config.timeout_s + 2.0
    assert result.wall_time_s <= elapsed
    follow_up = box.run("print(6 * 7, globals().get('canary'))")
    if killed:
        assert_gone(before, exclude=current_pids(box))
        assert follow_up.state_lost and follow_up.stdout == STATE_LOST_NOTICE + "42 None\n"
    else:
        assert not follow_up.state_lost and follow_up.stdout == "42 alive\n"
    return result


def test_reading_secrets_and_files_outside_the_temp_dir(survivor, tmp_path):
    host_file = tmp_path / "host_secret.txt"
    host_file.write_text("top secret")
    code = textwrap.dedent(f"""\
        import os
        for path in ['/etc/shadow', '/etc/passwd', {str(host_file)!r}, '/root/.bashrc',
                     '/work/main/README.md']:
            try:
                print(path, len(open(path, 'rb').read()))
            except OSError as exc:
                print(path, type(exc).__name__)
        print(sorted(os.listdir('/')))
        """)
    result = run_contained(survivor, code, killed=False)
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "/etc/shadow FileNotFoundError",
        "/etc/passwd FileNotFoundError",
        f"{host_file} FileNotFoundError",
        "/root/.bashrc FileNotFoundError",
        "/work/main/README.md FileNotFoundError",
    ]
    assert not {"home", "var", "srv", "boot", "mnt"} & set(lines[5].strip("[]").split(", "))
    assert "top secret" not in result.stdout


def test_writing_and_deleting_outside_the_temp_dir(survivor, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    python_dir = Path(os.__file__).parent
    code = textwrap.dedent(f"""\
        import os, shutil
        for path in ['/escape.txt', '/usr/escape.txt', '/dev/escape.txt', '/etc/escape.txt',
                     {str(python_dir / "escape.txt")!r}, {str(tmp_path / "escape.txt")!r},
                     '/media/escape.txt']:
            try:
                open(path, 'w').write('x')
                print(path, 'written')
            except OSError as exc:
                print(path, type(exc).__name__)
        for path in [{str(victim)!r}, {str(python_dir / "os.py")!r}]:
            try:
                os.remove(path)
                print(path, 'removed')
            except OSError as exc:
                print(path, type(exc).__name__)
        try:
            shutil.rmtree('/usr/lib')
        except OSError as exc:
            print('rmtree', type(exc).__name__)
        open('/tmp/inside.txt', 'w').write('fine')
        print(open('/tmp/inside.txt').read())
        """)
    result = run_contained(survivor, code, killed=False)
    assert "written" not in result.stdout and "removed" not in result.stdout
    assert result.stdout.endswith("rmtree PermissionError\nfine\n") or result.stdout.endswith("rmtree OSError\nfine\n")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "escape.txt").exists() and not (python_dir / "escape.txt").exists()
    assert (python_dir / "os.py").exists() and not Path("/escape.txt").exists()


def test_network_is_unreachable_even_to_a_host_loopback_server(survivor):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = textwrap.dedent(f"""\
        import socket
        for address in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:
            try:
                socket.create_connection(address, timeout=0.5)
                print(address[0], 'connected')
            except OSError as exc:
                print(address[0], type(exc).__name__)
        try:
            socket.getaddrinfo('pypi.org', 443)
            print('dns resolved')
        except OSError as exc:
            print('dns', type(exc).__name__)
        """)
    try:
        result = run_contained(survivor, code, killed=False)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert "connected" not in result.stdout and "resolved" not in result.stdout
    assert result.stdout.startswith("127.0.0.1 ConnectionRefusedError\n1.1.1.1 OSError\n")


def test_no_user_namespaces_and_no_capabilities(survivor):
    code = textwrap.dedent("""\
        import ctypes, multiprocessing
        libc = ctypes.CDLL(None, use_errno=True)
        for name, flags in [('user', 0x10000000), ('net', 0x40000000), ('mount', 0x20000)]:
            print(name, libc.unshare(flags), ctypes.get_errno())
        print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])
        with multiprocessing.get_context('fork').Pool(2) as workers:
            print(workers.map(abs, [-1, -2]))
        """)
    result = run_contained(survivor, code, killed=False)
    assert result.stdout == "user -1 1\nnet -1 1\nmount -1 1\n0000000000000000\n[1, 2]\n"


def test_process_count_is_limited(kind):
    with sandbox_of_kind(KILL_CONFIG, kind) as box:
        result = box.run(
            textwrap.dedent("""\
            import os, time
            children = 0
            while children < 1000:
                try:
                    pid = os.fork()
                except OSError as exc:
                    print('fork refused', type(exc).__name__)
                    break
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
            print('children', children)
            """)
        )
        trace = footprint(box)
    assert_gone(trace)
    refused, count = result.stdout.splitlines()
    assert refused == "fork refused BlockingIOError"
    assert 0 < int(count.split()[1]) < KILL_CONFIG.max_processes


def test_fork_bomb(victim):
    result = run_contained(
        victim, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", killed=True
    )
    assert result.timed_out and "did not finish within 2 s" in result.error


def test_memory_bomb(survivor):
    code = textwrap.dedent("""\
        try:
            huge = np.ones((100_000, 100_000))
        except MemoryError:
            print('one huge array refused')
        def hog():
            held = []
            while True:
                held.append(np.empty(64 << 20, dtype=np.uint8))
        hog()
        """)
    result = run_contained(survivor, code, killed=False)
    assert not result.timed_out and result.stdout == "one huge array refused\n"
    assert result.error.endswith(
        "MemoryError: Unable to allocate 64.0 MiB for an array with shape (67108864,) and data type uint8"
    )


def test_infinite_loop(victim):
    result = run_contained(victim, "while True:\n    pass", killed=True)
    assert result.timed_out and result.stdout == "" and result.images == []


def test_busy_cpu_threads(victim):
    code = textwrap.dedent("""\
        import threading
        def spin():
            while True:
                pass
        threads = [threading.Thread(target=spin) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        """)
    assert run_contained(victim, code, killed=True).timed_out


def test_sleeping_past_the_timeout_then_printing(victim):
    result = run_contained(victim, "import time\nprint('before')\ntime.sleep(4)\nprint('LATE')", killed=True)
    assert result.timed_out and "LATE" not in result.stdout


def test_threads_still_running_after_the_timeout_never_reach_a_later_call(victim):
    code = textwrap.dedent("""\
        import threading, time
        def late():
            time.sleep(2.5)
            print('LATE OUTPUT')
        threading.Thread(target=late, daemon=True).start()
        time.sleep(30)
        """)
    assert run_contained(victim, code, killed=True).timed_out
    time.sleep(1.0)
    follow_ups = [victim.run("print('next')"), victim.run("import time; time.sleep(1.5)")]
    assert follow_ups[0].stdout == "next\n"
    assert follow_ups[1].stdout == "" and follow_ups[1].error is None


def test_100_mb_of_stdout(survivor):
    result = run_contained(
        survivor, "print('x' * 100_000_000)\nimport os\nos.write(1, b'y' * 100_000_000)", killed=False
    )
    assert result.stdout == "x" * 1000 + "\n[... output truncated: 199999001 more bytes not shown ...]"


def test_huge_figure_is_refused(survivor):
    result = run_contained(
        survivor, "plt.figure(figsize=(200, 200), dpi=100)\nplt.plot([0, 1])\nplt.show()", killed=False
    )
    assert result.images == [] and not result.timed_out
    assert "20000x20000 pixels exceeds the limit" in result.error


def test_a_thousand_tiny_figures(survivor):
    result = run_contained(
        survivor,
        "for _ in range(1000):\n    plt.figure(figsize=(0.5, 0.5))\n    plt.show()\nprint(len(plt.get_fignums()))",
        killed=False,
    )
    assert [image.size for image in result.images] == [(50, 50)] * 8
    assert result.error == "992 image(s) refused: at most 8 images are returned per call"
    assert result.stdout == "0\n"


def test_os_exit(victim):
    result = run_contained(victim, "import os\nos._exit(7)", killed=True)
    assert "exited with status 7" in result.error and not result.timed_out


def test_segfault_through_ctypes(victim):
    result = run_contained(victim, "import ctypes\nctypes.string_at(0)", killed=True)
    assert "SIGSEGV" in result.error


def test_killing_the_parent_process(victim):
    """The parent is the first process of the runtime's PID namespace (bubblewrap's, or the
    init of a fork): killing it would end the namespace, and it is never reached."""
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('sent')"
    result = run_contained(victim, code, killed=False)
    if victim.uid is not None:  # root host: the sandbox uid may not signal it
        assert "PermissionError" in result.error
    else:  # PID 1 ignores the signals it has no handler for when they come from inside
        assert result.error is None and result.stdout == "sent\n"


def test_filling_the_disk(survivor):
    code = textwrap.dedent("""\
        try:
            open('/tmp/one_big_file', 'wb').write(b'0' * (64 << 20))
        except OSError as exc:
            print('big', exc.strerror)
        import glob, os
        try:
            for index in range(100):
                open(f'/tmp/part{index}', 'wb').write(b'0' * (15 << 20))
        except OSError as exc:
            print('many', exc.strerror)
        for path in glob.glob('/tmp/part*') + ['/tmp/one_big_file']:
            os.remove(path)
        """)
    result = run_contained(survivor, code, killed=False)
    assert result.stdout == "big File too large\nmany No space left on device\n"


def test_sabotaging_builtins_and_modules_stays_in_that_call(survivor, victim):
    sabotage = textwrap.dedent("""\
        import builtins, json, os, sys
        builtins.print = None
        builtins.len = lambda x: -1
        builtins.helper_added = 'kept'
        json.dumps = json.loads = None
        sys.stdout = None
        os.close(1)
        del sys.modules['numpy']
        sys.modules['os'] = None
        try:
            print('x')
        except TypeError:
            sys.stderr.write(f'broken here {len([1, 2])}')
        """)
    damaged = run_contained(survivor, sabotage, killed=False)
    assert damaged.error is None and damaged.stdout == "broken here -1"
    healed = survivor.run("import numpy, os\nprint(len([1, 2]), helper_added, numpy is np, os.getpid())")
    assert healed == RunResult(
        stdout="2 kept True 2\n",
        images=[],
        error=None,
        timed_out=False,
        wall_time_s=healed.wall_time_s,
        state_lost=False,
    )
    survivor.run("import sys\nsys.modules.clear()")
    assert survivor.run("import math\nprint(math.pi > 3)").stdout == "True\n"
    assert victim.run("print(len([1, 2]), 'helper_added' in dir(__builtins__))").stdout.endswith("2 False\n")


@pytest.mark.parametrize(
    "attack",
    [
        "import os\nos.write(1022, b'garbage that is not a frame')",
        "import os, struct\nos.write(1022, b'PVSB' + struct.pack('<IQ', 2, 0) + b'{}')",
        "import os\nos.closerange(3, 1024)",
    ],
)
def test_breaking_the_reply_channel_ends_only_that_runtime(victim, attack):
    result = run_contained(victim, attack, killed=True)
    assert result.error.startswith("SandboxCrash: ") and not result.timed_out
