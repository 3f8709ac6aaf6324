"""`ForkServer`: the runtimes of one pool, forked from a template that imported the runtime's
libraries once, kept running for the pool's life and restarted when it dies.

Where this host cannot give a fork namespaces of its own (nested namespaces unavailable), the
first start says why in a one-line warning (once per process) and the pool starts each
runtime in a fresh bubblewrap instead; later pools with the same bubblewrap do so at once.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Callable

from pyvision_jax.agent.sandbox.cgroups import SandboxMemory
from pyvision_jax.agent.sandbox.config import SandboxConfig
from pyvision_jax.agent.sandbox.errors import SandboxError, SandboxStartError
from pyvision_jax.agent.sandbox.forked import ForkedRuntime
from pyvision_jax.agent.sandbox.host_dirs import create_host_dir, remove_host_dir
from pyvision_jax.agent.sandbox.template import RuntimeTemplate, TemplateGone

SANDBOXES_DIR_NAME = "sandboxes"

_unavailable_lock = threading.Lock()
_unavailable_with: set[str] = set()  # the bwraps whose templates could not fork (this process)


def _mark_unavailable(bwrap: str, reason: str) -> None:
    """Records that forks are unavailable with `bwrap`; warns the first time in a process."""
    with _unavailable_lock:
        first = not _unavailable_with
        _unavailable_with.add(bwrap)
    if not first:
        return
    first_line = reason.strip().splitlines()[0] if reason.strip() else "unknown reason"
    warnings.warn(
        f"sandbox runtimes cannot be forked from a template on this host "
        f"({first_line}); each starts in a fresh bubblewrap instead",
        RuntimeWarning,
        stacklevel=2,
    )


class ForkServer:
    """Forks the runtimes of one pool (isolated modes only). Thread-safe.

    Its host directory holds the template's log and, under SANDBOXES_DIR_NAME, the host
    directories of the pool's sandboxes (`create_host_dir`), which the template sees.
    """

    def __init__(self, config: SandboxConfig, mode: str, bwrap: str):
        self.config = config
        self.mode = mode
        self._bwrap = bwrap
        self._lock = threading.Lock()
        self._template: RuntimeTemplate | None = None
        self._available: bool | None = None  # None until the first template has started
        self._closed = False
        self._host_dir, self._owner_lock = create_host_dir()
        (self._host_dir / SANDBOXES_DIR_NAME).mkdir(mode=0o755)

    @property
    def template_pid(self) -> int | None:
        """Host pid of the running template's bubblewrap, or None."""
        template = self._template
        return None if template is None or not template.alive() else template.pid

    def create_host_dir(self) -> tuple[Path, int]:
        """A host directory for one of the pool's sandboxes, and its owner lock."""
        return create_host_dir(self._host_dir / SANDBOXES_DIR_NAME)

    def _running_template(self, cancelled: Callable[[], bool]) -> RuntimeTemplate | None:
        """The live template (started, or restarted, now if needed); None where forks are
        unavailable."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            if self._available is None and self._bwrap in _unavailable_with:
                self._available = False
            if self._available is False:
                return None
            if self._template is not None and self._template.alive():
                return self._template
            if self._template is not None:
                self._template.close()
                self._template = None
            try:
                template = RuntimeTemplate(
                    self.config,
                    self.mode,
                    self._bwrap,
                    self._host_dir / SANDBOXES_DIR_NAME,
                    self._host_dir / "template.log",
                    cancelled,
                )
            except SandboxStartError as exc:
                if self._available is None and not cancelled():
                    self._available = False
                    _mark_unavailable(self._bwrap, str(exc))
                    return None
                raise
            if self._available is None and not self._probe(template, cancelled):
                return None
            self._template = template
            return template

    def _probe(self, template: RuntimeTemplate, cancelled: Callable[[], bool]) -> bool:
        """Forks one runtime to learn whether forks get their namespaces here."""
        host_dir, owner_lock = self.create_host_dir()
        try:
            (host_dir / "media").mkdir(mode=0o755)
            ForkedRuntime(template, self.config, host_dir, cancelled).kill()
        except SandboxStartError as exc:
            template.close()
            if cancelled():
                raise
            self._available = False
            _mark_unavailable(self._bwrap, str(exc).removeprefix("sandbox runtime failed to start:"))
            return False
        finally:
            remove_host_dir(host_dir, owner_lock)
        self._available = True
        return True

    def start_runtime(
        self, host_dir: Path, cancelled: Callable[[], bool], memory: SandboxMemory
    ) -> ForkedRuntime | None:
        """A runtime for the sandbox of `host_dir` (made by `create_host_dir`), forked from
        the template and held to `memory`; None where forks are unavailable on this host."""
        template = self._running_template(cancelled)
        if template is None:
            return None
        try:
            return ForkedRuntime(template, self.config, host_dir, cancelled, memory)
        except TemplateGone:
            template = self._running_template(cancelled)  # a fresh one, once
            if template is None:
                return None
            return ForkedRuntime(template, self.config, host_dir, cancelled, memory)

    def close(self) -> None:
        """Kills the template (and every runtime forked from it) and removes the host
        directory; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            template, self._template = self._template, None
        if template is not None:
            template.close()
        remove_host_dir(self._host_dir, self._owner_lock)
