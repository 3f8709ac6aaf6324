"""Hostile code: every case returns a clear RunResult within timeout + 2 s, leaves no
process behind, and leaves the host and the next sandbox unaffected."""

from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from pyvision_jax.agent.sandbox import STATE_LOST_NOTICE, RunResult, Sandbox, SandboxConfig, \
    SandboxPool
from tests.agent.test_sandbox import assert_gone, current_pids, footprint

TIMEOUT_S = 2.0
CONFIG = SandboxConfig(timeout_s=TIMEOUT_S, max_stdout_bytes=1000, memory_bytes=1 << 30,
                       max_processes=32, max_file_bytes=16 << 20, tmpfs_bytes=64 << 20,
                       max_images_per_call=8)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(CONFIG, size=2) as warm:
        yield warm


def run_contained(pool: SandboxPool, code: str, *, killed: bool) -> RunResult:
    """Runs `code` in a fresh sandbox and checks the containment properties every case needs.

    killed: whether the case must end the runtime (then its processes must all be gone and
    the same sandbox must come back with state_lost); otherwise the sandbox keeps its state.
    """
    box = pool.acquire(timeout_s=120)
    try:
        box.run("canary = 'alive'")
        before = footprint(box)
        start = time.monotonic()
        result = box.run(code)
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT_S + 2.0
        assert result.wall_time_s <= elapsed
        follow_up = box.run("print(6 * 7, globals().get('canary'))")
        if killed:
            assert_gone(before, exclude=current_pids(box))
            assert follow_up.state_lost and follow_up.stdout == STATE_LOST_NOTICE + "42 None\n"
        else:
            assert not follow_up.state_lost and follow_up.stdout == "42 alive\n"
        return result
    finally:
        print_ = footprint(box) if box.alive() else None
        pool.release(box)
        if print_ is not None:
            assert_gone(print_, grace_s=30)


def test_reading_secrets_and_files_outside_the_temp_dir(pool, tmp_path):
    host_file = tmp_path / "host_secret.txt"
    host_file.write_text("top secret")
    code = textwrap.dedent(f"""\
        import os
        for path in ['/etc/shadow', '/etc/passwd', {str(host_file)!r}, '/root/.bashrc',
                     '/work/main/README.md', '/proc/1/environ']:
            try:
                print(path, len(open(path, 'rb').read()))
            except OSError as exc:
                print(path, type(exc).__name__)
        print(sorted(os.listdir('/')))
        """)
    result = run_contained(pool, code, killed=False)
    lines = result.stdout.splitlines()
    assert lines[:5] == ["/etc/shadow FileNotFoundError", "/etc/passwd FileNotFoundError",
                         f"{host_file} FileNotFoundError", "/root/.bashrc FileNotFoundError",
                         "/work/main/README.md FileNotFoundError"]
    assert lines[5].split()[1] in ("PermissionError", "FileNotFoundError")
    assert "top secret" not in result.stdout


def test_writing_and_deleting_outside_the_temp_dir(pool, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    python_dir = Path(os.__file__).parent
    code = textwrap.dedent(f"""\
        import os, shutil
        for path in ['/escape.txt', '/usr/escape.txt', '/dev/shm/escape.txt',
                     {str(python_dir / 'escape.txt')!r}, {str(tmp_path / 'escape.txt')!r},
                     '/media/escape.txt']:
            try:
                open(path, 'w').write('x')
                print(path, 'written')
            except OSError as exc:
                print(path, type(exc).__name__)
        for path in [{str(victim)!r}, {str(python_dir / 'os.py')!r}]:
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
    result = run_contained(pool, code, killed=False)
    assert "written" not in result.stdout and "removed" not in result.stdout
    assert result.stdout.endswith("rmtree PermissionError\nfine\n") or \
        result.stdout.endswith("rmtree OSError\nfine\n")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "escape.txt").exists() and not (python_dir / "escape.txt").exists()
    assert (python_dir / "os.py").exists() and not Path("/escape.txt").exists()


def test_network_is_unreachable_even_to_a_host_loopback_server(pool):
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
        result = run_contained(pool, code, killed=False)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert "connected" not in result.stdout and "resolved" not in result.stdout
    assert result.stdout.startswith("127.0.0.1 ConnectionRefusedError\n1.1.1.1 OSError\n")


def test_process_count_is_limited(pool):
    box = pool.acquire(timeout_s=120)
    try:
        result = box.run(textwrap.dedent("""\
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
            """))
        print_ = footprint(box)
    finally:
        pool.release(box)
    assert_gone(print_, grace_s=30)
    refused, count = result.stdout.splitlines()
    assert refused == "fork refused BlockingIOError"
    assert 0 < int(count.split()[1]) < CONFIG.max_processes


def test_fork_bomb(pool):
    result = run_contained(pool, "import os\nwhile True:\n    try:\n        os.fork()\n"
                                 "    except OSError:\n        pass\n", killed=True)
    assert result.timed_out and "did not finish within 2 s" in result.error


def test_memory_bomb(pool):
    code = textwrap.dedent("""\
        try:
            huge = np.ones((100_000, 100_000))
        except MemoryError:
            print('one huge array refused')
        hog = []
        while True:
            hog.append(np.empty(64 << 20, dtype=np.uint8))
        """)
    result = run_contained(pool, code, killed=False)
    assert not result.timed_out and result.stdout == "one huge array refused\n"
    assert result.error.endswith("MemoryError: Unable to allocate 64.0 MiB for an array with "
                                 "shape (67108864,) and data type uint8")


def test_infinite_loop(pool):
    result = run_contained(pool, "while True:\n    pass", killed=True)
    assert result.timed_out and result.stdout == "" and result.images == []


def test_busy_cpu_threads(pool):
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
    assert run_contained(pool, code, killed=True).timed_out


def test_sleeping_past_the_timeout_then_printing(pool):
    result = run_contained(pool, "import time\nprint('before')\ntime.sleep(4)\nprint('LATE')",
                           killed=True)
    assert result.timed_out and "LATE" not in result.stdout


def test_threads_still_running_after_the_timeout_never_reach_a_later_call(pool):
    code = textwrap.dedent("""\
        import threading, time
        def late():
            time.sleep(2.5)
            print('LATE OUTPUT')
        threading.Thread(target=late, daemon=True).start()
        time.sleep(30)
        """)
    box = pool.acquire(timeout_s=120)
    try:
        assert box.run(code).timed_out
        time.sleep(1.0)
        follow_ups = [box.run("print('next')"), box.run("import time; time.sleep(1.5)")]
        assert follow_ups[0].stdout == STATE_LOST_NOTICE + "next\n"
        assert follow_ups[1].stdout == "" and follow_ups[1].error is None
    finally:
        pool.release(box)


def test_100_mb_of_stdout(pool):
    result = run_contained(pool, "print('x' * 100_000_000)\nimport os\n"
                                 "os.write(1, b'y' * 100_000_000)", killed=False)
    assert result.stdout == "x" * 1000 + \
        "\n[... output truncated: 199999001 more bytes not shown ...]"


def test_huge_figure_is_refused(pool):
    result = run_contained(pool, "plt.figure(figsize=(200, 200), dpi=100)\n"
                                 "plt.plot([0, 1])\nplt.show()", killed=False)
    assert result.images == [] and not result.timed_out
    assert "20000x20000 pixels exceeds the limit" in result.error


def test_a_thousand_tiny_figures():
    config = dataclasses.replace(CONFIG, timeout_s=20.0)  # creating 1000 figures takes a while
    with Sandbox(config) as box:
        print_ = footprint(box)
        result = box.run("for _ in range(1000):\n    plt.figure(figsize=(0.5, 0.5))\n"
                         "    plt.show()\nprint(len(plt.get_fignums()))")
    assert_gone(print_)
    assert [image.size for image in result.images] == [(50, 50)] * 8
    assert result.error == "992 image(s) refused: at most 8 images are returned per call"
    assert result.stdout == "0\n"


def test_os_exit(pool):
    result = run_contained(pool, "import os\nos._exit(7)", killed=True)
    assert "exited with status 7" in result.error and not result.timed_out


def test_segfault_through_ctypes(pool):
    result = run_contained(pool, "import ctypes\nctypes.string_at(0)", killed=True)
    assert "SIGSEGV" in result.error


def test_killing_the_parent_process(pool):
    box = pool.acquire(timeout_s=120)
    try:
        print_ = footprint(box)
        result = box.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                         "import time\ntime.sleep(5)")
        if box.uid is not None:  # root host: the sandbox uid may not signal bubblewrap
            assert "PermissionError" in result.error
        else:
            assert "SandboxCrash" in result.error
        assert "42" in box.run("print(6 * 7)").stdout
        if box.uid is None:
            assert_gone(print_, exclude=current_pids(box))
    finally:
        pool.release(box)


def test_filling_the_disk(pool):
    code = textwrap.dedent("""\
        try:
            open('/tmp/one_big_file', 'wb').write(b'0' * (64 << 20))
        except OSError as exc:
            print('big', exc.strerror)
        try:
            for index in range(100):
                open(f'/tmp/part{index}', 'wb').write(b'0' * (15 << 20))
        except OSError as exc:
            print('many', exc.strerror)
        """)
    result = run_contained(pool, code, killed=False)
    assert result.stdout == "big File too large\nmany No space left on device\n"


def test_sabotaging_builtins_and_modules_stays_in_that_call(pool):
    box = pool.acquire(timeout_s=120)
    try:
        sabotage = textwrap.dedent("""\
            import builtins, json, os, sys
            saved_print = print
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
        damaged = box.run(sabotage)
        assert damaged.error is None and damaged.stdout == "broken here -1"
        healed = box.run("import numpy, os\nprint(len([1, 2]), helper_added, "
                         "numpy is np, os.getpid())")
        assert healed == RunResult(stdout="2 kept True 2\n", images=[], error=None,
                                   timed_out=False, wall_time_s=healed.wall_time_s,
                                   state_lost=False)
        box.run("import sys\nsys.modules.clear()")
        assert box.run("import math\nprint(math.pi > 3)").stdout == "True\n"
    finally:
        pool.release(box)


@pytest.mark.parametrize("attack", [
    "import os\nos.write(1022, b'garbage that is not a frame')",
    "import os, struct\nos.write(1022, b'PVSB' + struct.pack('<IQ', 2, 0) + b'{}')",
    "import os\nos.closerange(3, 1024)",
])
def test_breaking_the_reply_channel_ends_only_that_runtime(pool, attack):
    result = run_contained(pool, attack, killed=True)
    assert result.error.startswith("SandboxCrash: ") and not result.timed_out
