"""A stand-in for the sandbox pool that never executes code: each code string carries
directives (lines ``#! name args``) saying what the 'run' returns, so episode tests can
produce any result deterministically."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from PIL import Image


@dataclass(frozen=True)
class FakeRunResult:
    stdout: str
    images: list
    error: str | None
    timed_out: bool
    wall_time_s: float
    state_lost: bool


@dataclass
class FakeSandbox:
    """Directives: ``print TEXT``, ``images N WxH``, ``error TEXT``, ``timeout``, ``crash``,
    ``raise``, ``preload-fails``, ``names`` (print the preloaded names), ``wait EVENT`` (block until the pool's
    named event is set, at most 10 s)."""

    pool: "FakePool"
    preloaded: dict = field(default_factory=dict)
    codes: list = field(default_factory=list)
    restarted: bool = False

    def preload_image(self, name, image):
        if any("#! preload-fails" in code for code in self.codes):
            raise RuntimeError("preload failed")
        self.preloaded[name] = image

    def preload_video(self, name, path):
        self.preloaded[name] = str(path)

    def preload_code(self, name, code):
        self.preloaded[name] = code

    def run(self, code: str) -> FakeRunResult:
        self.codes.append(code)
        stdout, images, error, timed_out = [], [], None, False
        state_lost, self.restarted = self.restarted, False
        if state_lost:  # like the real sandbox: the killed runtime restarted, media restored
            stdout.append("[session restarted]")
        for line in code.splitlines():
            if not line.startswith("#! "):
                continue
            name, _, arg = line[3:].partition(" ")
            if name == "print":
                stdout.append(arg)
            elif name == "images":
                count, size = arg.split()
                w, h = (int(x) for x in size.split("x"))
                images += [Image.new("RGB", (w, h), (10 * i, 100, 200)) for i in range(int(count))]
            elif name == "error":
                error = arg
            elif name == "timeout":
                timed_out, error, self.restarted = True, "TimeoutError: too slow", True
            elif name == "crash":
                error, self.restarted = "SandboxCrash: the process died", True
            elif name == "raise":
                raise RuntimeError("sandbox infrastructure broke")
            elif name == "names":
                stdout.append(" ".join(sorted(self.preloaded)))
            elif name == "wait":
                self.pool.log(f"run-wait:{arg}")
                released = self.pool.events[arg].wait(timeout=10)
                self.pool.log(f"run-end:{arg}:{'released' if released else 'timed-out'}")
        return FakeRunResult("\n".join(stdout) + ("\n" if stdout else ""), images, error, timed_out, 0.001, state_lost)


class FakePool:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = {}
        self.acquired: list[FakeSandbox] = []
        self.released: list[FakeSandbox] = []
        self.events_log: list[str] = []

    def log(self, entry: str) -> None:
        with self.lock:
            self.events_log.append(entry)

    def event(self, name: str) -> threading.Event:
        self.events[name] = threading.Event()
        return self.events[name]

    def acquire(self, timeout_s=None) -> FakeSandbox:
        sandbox = FakeSandbox(self)
        with self.lock:
            self.acquired.append(sandbox)
        return sandbox

    def release(self, sandbox) -> None:
        with self.lock:
            self.released.append(sandbox)
