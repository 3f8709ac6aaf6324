"""Sandbox behaviour: persistence, output capture, images, guards, preloads, pool, shutdown."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from pyvision_jax.agent.sandbox import (
    STATE_LOST_NOTICE,
    RunResult,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPool,
    SandboxUnavailableError,
)
from pyvision_jax.agent.sandbox.host_dirs import sweep_abandoned_host_dirs
from tests.agent.sandbox_probes import (
    RUNTIME_KINDS,
    Footprint,
    assert_gone,
    descendants,
    footprint,
    process_footprint,
    sandbox_of_kind,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = SandboxConfig(timeout_s=20.0, max_stdout_bytes=2000, max_images_per_call=4, max_image_pixels=4_000_000)


@pytest.fixture(scope="module", params=RUNTIME_KINDS)
def sandbox(request):
    with sandbox_of_kind(CONFIG, request.param) as box:
        yield box


def test_state_persists_and_stdout_is_captured(sandbox):
    first = sandbox.run("value = 20\nprint('first', value)")
    second = sandbox.run("value += 1\nprint(value)\nimport os\nos.write(1, b'fd1 ')\nos.write(2, b'fd2')")
    assert first == RunResult(
        stdout="first 20\n", images=[], error=None, timed_out=False, wall_time_s=first.wall_time_s, state_lost=False
    )
    assert second.stdout == "21\nfd1 fd2" and second.error is None


def test_preimported_names_and_importable_libraries(sandbox):
    result = sandbox.run(
        textwrap.dedent("""\
        import scipy.ndimage, skimage
        print(np.__name__, Image.__name__, plt.__name__, io.__name__, base64.__name__,
              math.__name__, matplotlib.get_backend())
        """)
    )
    assert result.error is None
    assert result.stdout == ("numpy PIL.Image matplotlib.pyplot io base64 math module://pyvision_sandbox_backend\n")


def test_error_reports_traceback_tail_and_keeps_state(sandbox):
    result = sandbox.run("kept = 5\ndef f():\n    return 1 / 0\nf()")
    assert "ZeroDivisionError: division by zero" in result.error
    assert "return 1 / 0" in result.error
    frames = [line for line in result.error.splitlines() if line.startswith('  File "')]
    assert frames and all(line.startswith('  File "<code ') for line in frames)
    assert sandbox.run("print(kept)").stdout == "5\n"
    syntax = sandbox.run("def broken(:\n")
    assert syntax.error.startswith("  File") and "SyntaxError" in syntax.error


def test_system_exit_is_an_error_not_a_crash(sandbox):
    result = sandbox.run("marker = 1\nraise SystemExit(3)")
    assert "SystemExit: 3" in result.error and not result.timed_out
    assert sandbox.run("print(marker)").stdout == "1\n"


def test_stdout_is_truncated_with_a_marker(sandbox):
    result = sandbox.run("print('a' * 5000)")
    kept, marker = result.stdout.split("\n[... output truncated: ")
    assert kept == "a" * CONFIG.max_stdout_bytes
    assert marker == f"{5001 - CONFIG.max_stdout_bytes} more bytes not shown ...]"


def test_figures_and_display_become_images(sandbox):
    result = sandbox.run(
        textwrap.dedent("""\
        plt.figure(figsize=(4, 3), dpi=50)
        plt.imshow(np.zeros((10, 10)))
        plt.show()
        display(Image.new('RGB', (30, 20), (255, 0, 0)))
        display(np.full((5, 7, 3), 7, dtype=np.uint8))
        Image.new('L', (9, 9)).show()
        display('text')
        print(len(plt.get_fignums()))
        """)
    )
    assert result.error is None
    assert [image.size for image in result.images] == [(200, 150), (30, 20), (7, 5), (9, 9)]
    assert result.images[1].getpixel((0, 0)) == (255, 0, 0)
    assert result.stdout == "'text'\n0\n"


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_matplotlib_imported_by_the_code_under_another_name_still_shows_figures(kind):
    """A runtime in a fresh bubblewrap starts without matplotlib (most episodes never plot);
    a forked one has it from its template. Either way, code that imports it itself, under
    another name, shows figures through the capturing backend."""
    with sandbox_of_kind(CONFIG, kind) as box:
        before = box.run("import sys\nprint('matplotlib' in sys.modules)")
        assert before.stdout == ("True\n" if kind == "forked" else "False\n")
        result = box.run(
            textwrap.dedent("""\
            import matplotlib.pyplot as pp
            from matplotlib.figure import Figure
            pp.figure(figsize=(2, 1), dpi=50)
            pp.plot([0, 1])
            pp.show()
            figure = Figure(figsize=(1, 1), dpi=40)
            figure.add_subplot().plot([1, 0])
            display(figure)
            print(pp.get_backend(), plt is not pp, plt.gcf is pp.gcf)
            """)
        )
    assert result.error is None, result.error
    assert [image.size for image in result.images] == [(100, 50), (40, 40)]
    assert result.stdout == "module://pyvision_sandbox_backend True True\n"


def test_image_guards_refuse_and_report(sandbox):
    result = sandbox.run(
        textwrap.dedent("""\
        plt.figure(figsize=(20, 0.1), dpi=100)
        plt.show()
        display(Image.new('RGB', (3000, 2000)))
        display(Image.new('RGB', (199, 1)))
        for _ in range(6):
            display(Image.new('RGB', (8, 8)))
        """)
    )
    assert [image.size for image in result.images] == [(199, 1)] + [(8, 8)] * 3
    assert "2000x10 has an aspect ratio of at least 200" in result.error
    assert "3000x2000 pixels exceeds the limit of 4000000 pixels" in result.error
    assert "3 image(s) refused: at most 4 images are returned per call" in result.error


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_preload_image_from_pil_and_path_and_restore_after_restart(tmp_path, kind):
    big = Image.fromarray(np.arange(3000 * 2000 * 3, dtype=np.uint32).astype(np.uint8).reshape(2000, 3000, 3))
    path = tmp_path / "clue.jpg"
    Image.new("L", (64, 32), 200).save(path)
    config = dataclasses.replace(CONFIG, timeout_s=2.0)
    with sandbox_of_kind(config, kind) as box:
        box.preload_image("image_clue_0", big)
        box.preload_image("image_clue_1", path)
        check = (
            "print(image_clue_0.size, image_clue_0.mode, image_clue_1.size, "
            "image_clue_1.mode, np.asarray(image_clue_0)[1, 2].tolist())"
        )
        expected = f"(3000, 2000) RGB (64, 32) RGB {np.asarray(big)[1, 2].tolist()}\n"
        assert box.run(check).stdout == expected
        assert box.run("while True: pass").timed_out
        restored = box.run(check)
        assert restored.state_lost and restored.stdout == STATE_LOST_NOTICE + expected
        with pytest.raises(ValueError, match="identifier"):
            box.preload_image("not a name", path)
        with pytest.raises(FileNotFoundError, match="missing.png"):
            box.preload_image("image_clue_2", tmp_path / "missing.png")
        (tmp_path / "bad.png").write_bytes(b"not an image")
        with pytest.raises(SandboxError, match="cannot identify image file"):
            box.preload_image("image_clue_3", tmp_path / "bad.png")


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_preload_code_defines_helpers_that_survive_a_restart(kind):
    config = dataclasses.replace(CONFIG, timeout_s=2.0)
    with sandbox_of_kind(config, kind) as box:
        box.preload_image("image_clue_0", Image.new("RGB", (8, 4), (10, 20, 30)))
        box.preload_code("setup", "print('dropped')\ndef size():\n    print(image_clue_0.size)\n")
        assert box.run("size()").stdout == "(8, 4)\n"
        assert box.run("while True: pass").timed_out
        restored = box.run("size()")
        assert restored.state_lost and restored.stdout == STATE_LOST_NOTICE + "(8, 4)\n"
        with pytest.raises(SandboxError, match="(?s)load_code of 'broken' failed: .*ZeroDivisionError"):
            box.preload_code("broken", "1 / 0")
        with pytest.raises(TypeError, match="as a string"):
            box.preload_code("setup", b"size()")
        assert box.run("size()").stdout == "(8, 4)\n"


def test_preload_video_gives_a_decord_reader(sandbox, tmp_path):
    import imageio_ffmpeg

    path = tmp_path / "clip.mp4"
    writer = imageio_ffmpeg.write_frames(str(path), (64, 48), fps=5, macro_block_size=16, ffmpeg_log_level="error")
    writer.send(None)
    for index in range(10):
        writer.send(np.full((48, 64, 3), index * 20, dtype=np.uint8).tobytes())
    writer.close()
    path.chmod(0o600)  # unreadable for the sandbox uid: the sandbox gets a copy
    sandbox.preload_video("video_clue_0", path)
    result = sandbox.run(
        "frame = video_clue_0[3].asnumpy()\n"
        "print(len(video_clue_0), frame.shape, round(video_clue_0.get_avg_fps()),"
        " VideoReader.__name__, type(cpu(0)).__name__)"
    )
    assert result.error is None
    assert result.stdout == "10 (48, 64, 3) 5 VideoReader DECORDContext\n"


def test_sandboxes_do_not_see_each_other_and_close_kills_everything(sandbox):
    other = Sandbox(CONFIG)
    sandbox.run("open('/tmp/secret', 'w').write('mine')\nshared_name = 1")
    seen = other.run(
        "import os\nprint(os.path.exists('/tmp/secret'), "
        "'shared_name' in globals(), sorted(int(p) for p in os.listdir('/proc') "
        "if p.isdigit()))"
    )
    assert seen.stdout == "False False [1, 2]\n"
    trace = footprint(other)
    other.close()
    other.close()
    assert_gone(trace)
    with pytest.raises(SandboxError, match="closed"):
        other.run("print(1)")


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="max_aspect_ratio"):
        SandboxConfig(max_aspect_ratio=1)


UNISOLATED_SCRIPT = """
import json, warnings
from pyvision_jax.agent.sandbox import Sandbox, SandboxConfig
config = SandboxConfig(timeout_s=20.0, bwrap_path="/nonexistent/bwrap", allow_unisolated=True)
boxes, caught = [], []
for _ in range(2):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        boxes.append(Sandbox(config))
    caught.append([f"{w.category.__name__}: {w.message}" for w in seen
                   if issubclass(w.category, RuntimeWarning)])
outputs = [box.run(f"print({index})").stdout for index, box in enumerate(boxes)]
for box in boxes:
    box.close()
print(json.dumps({"warnings": caught, "outputs": outputs}))
"""


def test_without_bubblewrap_refuses_unless_allowed_then_warns_once():
    missing = dataclasses.replace(CONFIG, bwrap_path="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailableError, match="allow_unisolated"):
        Sandbox(missing)
    # Once per process: in a fresh one, the first unisolated sandbox warns, the second not.
    fresh = subprocess.run(
        [sys.executable, "-c", UNISOLATED_SCRIPT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(fresh.stdout.splitlines()[-1]) == {
        "warnings": [
            [
                "RuntimeWarning: bubblewrap is not installed: sandboxes run "
                "model-written code WITHOUT isolation (allow_unisolated=True)"
            ],
            [],
        ],
        "outputs": ["0\n", "1\n"],
    }
    allowed = dataclasses.replace(missing, allow_unisolated=True, timeout_s=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # this process may have warned before
        box = Sandbox(allowed)
    with box:
        assert not box.isolated and box.uid is None
        assert box.run("x = 2\nprint(x * 21)").stdout == "42\n"
        trace = footprint(box)
        assert box.run("import time\ntime.sleep(10)").timed_out
        assert_gone(trace)


def test_pool_hands_out_fresh_sandboxes_and_replaces_released_ones():
    earlier = descendants()
    with SandboxPool(CONFIG, size=1) as pool:
        first = pool.acquire(timeout_s=120)
        assert first.forked
        first.run("leftover = 1")
        trace = footprint(first)
        pool.release(first)
        assert_gone(trace, grace_s=30)
        second = pool.acquire(timeout_s=120)
        assert second is not first
        assert second.run("print('leftover' in globals())").stdout == "False\n"
        with pytest.raises(ValueError, match="did not hand out"):
            pool.release(first)
        deadline = time.monotonic() + 120
        while pool.idle_count() < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.idle_count() == 1
        # Every process the pool started and still has: the leased runtime and the idle one,
        # each in its own PID namespace, and the template they were forked from in its own.
        started = process_footprint(descendants() - earlier)
        assert len(started.namespaces) == 3
        assert pool.template_pid in {proc.pid for proc in started.processes}
        prints = [footprint(second), started]
    for trace in prints:
        assert_gone(trace, grace_s=30)  # closing two runtimes can take seconds on a loaded machine
    with pytest.raises(SandboxError, match="closed"):
        pool.acquire(timeout_s=1)


def test_pool_is_thread_safe_and_closes_everything_on_exception():
    results: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    prints: list[Footprint] = []

    def worker(index: int, pool: SandboxPool) -> None:
        try:
            box = pool.acquire(timeout_s=120)
            results.append((index, box.run(f"tag = {index}\nprint(tag * 2)").stdout))
            pool.release(box)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    with pytest.raises(KeyError):
        with SandboxPool(CONFIG, size=2) as pool:
            threads = [threading.Thread(target=worker, args=(i, pool)) for i in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            prints.append(footprint(pool.acquire(timeout_s=120)))
            raise KeyError("an error in the owner")
    assert errors == []
    assert sorted(results) == [(i, f"{i * 2}\n") for i in range(3)]
    assert_gone(prints[0])


def test_cancelled_starts_leave_no_process():
    marker = 12_347  # a config value that appears in the command line of these starts only
    config = dataclasses.replace(CONFIG, max_stdout_bytes=marker)
    outcomes: list[object] = []

    def start(cancel: threading.Event) -> None:
        try:
            outcomes.append(Sandbox(config, cancel=cancel))
        except SandboxError as exc:
            outcomes.append(exc)

    for delay_s in (0.0, 0.005, 0.02, 0.05, 0.1, 0.3):
        cancel = threading.Event()
        thread = threading.Thread(target=start, args=(cancel,))
        thread.start()
        time.sleep(delay_s)
        cancel.set()
        thread.join()
    for outcome in outcomes:
        if isinstance(outcome, Sandbox):
            outcome.close()
        else:
            assert "cancelled" in str(outcome)

    def leftovers() -> list[int]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if f'"max_stdout_bytes": {marker}' in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        return found

    deadline = time.monotonic() + 30  # a bound only: under load the kills take a moment
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(outcomes) == 6 and leftovers() == []


OWNER_SCRIPT = """
import json, threading, time
from pathlib import Path
import psutil
from pyvision_jax.agent.sandbox import SandboxConfig, SandboxPool
from pyvision_jax.agent.sandbox.host_dirs import OWNER_LOCK_NAME
pool = SandboxPool(SandboxConfig(timeout_s=120), size=1)
leased = pool.acquire(timeout_s=120)
threading.Thread(target=leased.run, args=("import time; time.sleep(100)",), daemon=True).start()
while pool.idle_count() < 1:
    time.sleep(0.05)
owner = psutil.Process()
pids = [proc.pid for proc in owner.children(recursive=True)]
dirs = [str(Path(file.path).parent) for file in owner.open_files()
        if Path(file.path).name == OWNER_LOCK_NAME]
print(json.dumps({"pids": pids, "dirs": dirs}), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_owner_termination_leaves_no_process(signum, monkeypatch):
    # The owner's temp dir is its own: a sandbox started by another test process sweeps the
    # shared temp dir, and would remove a killed owner's directories before this test looks.
    temp_root = Path(tempfile.mkdtemp(prefix="pyvision_owner_test_"))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(temp_root)},
        text=True,
    )
    try:
        report = json.loads(owner.stdout.readline())
        trace = process_footprint(report["pids"])
        dirs = [Path(path) for path in report["dirs"]]
        # The leased and the idle sandbox, and the pool's template (whose host directory
        # holds theirs).
        assert len(trace.namespaces) == 3 and len(dirs) == 3
        owner.send_signal(signum)
        assert owner.wait(timeout=30) == -signum
        assert_gone(trace, grace_s=10)
        if signum == signal.SIGKILL:  # no cleanup was possible: the next owner sweeps
            assert all(path.is_dir() and temp_root in path.parents for path in dirs)
            monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
            sweep_abandoned_host_dirs()
        assert not any(path.exists() for path in dirs)
    finally:
        owner.kill()
        owner.wait()
        shutil.rmtree(temp_root, ignore_errors=True)
