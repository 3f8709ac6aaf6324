"""What every training run does around its steps, shared by GRPO (`train.trainer`) and SFT
(`train.sft`): SIGTERM handling, the workdir's directories and `config.json`, the
`jax.distributed` start and the mesh, restore-or-init through `restore_intact`, process 0
alone writing TensorBoard and the run's files, removing what a killed run wrote for the
steps it redoes, and the progress bar.

A run with several processes starts JAX's distributed runtime first (before any other JAX
call), every process saves and restores the orbax checkpoints, and stop decisions are
process 0's (`multihost.agree`), so that all processes take the same path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from jax.sharding import Mesh
from tqdm import tqdm

from pyvision_jax.convert.run_layout import CHECKPOINT_DIR, RESOLVED_CONFIG, TB_DIR
from pyvision_jax.run_logs.metrics import MetricsWriter
from pyvision_jax.run_logs.run_outputs import truncate_events, truncate_jsonl
from pyvision_jax.train.checkpoint import TrainCheckpoints
from pyvision_jax.train.mesh import DistributedSettings, MeshSettings
from pyvision_jax.train.multihost import agree, is_primary
from pyvision_jax.train.state import TrainState
from pyvision_jax.train.workdir_lock import WorkdirLock, WorkdirLockedError


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The run's length, checkpoint cadence, processes and mesh, and the resolved config
    (JSON text) that process 0 writes to WORKDIR/config.json."""

    steps: int
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    distributed: DistributedSettings = DistributedSettings()
    mesh: MeshSettings = MeshSettings()
    resolved_config: str = "{}"

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0, got {self.steps}")


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """What a run did and where its outputs are."""

    first_step: int
    last_step: int
    interrupted: bool
    checkpoint_dir: str
    tensorboard_dir: str
    workdir: str


class RunHarness:
    """One run in `workdir`: open it (`open`), restore or initialise its state
    (`restore_or_init`), then step while `running`; `close` at the end."""

    def __init__(
        self,
        workdir: str | Path,
        settings: RunSettings,
        *,
        progress: bool = True,
        log: Callable[[str], None] | None = None,
        jsonl_outputs: Sequence[str] = (),
    ):
        self.workdir = Path(workdir).absolute()
        self.settings = settings
        self.progress = progress
        self.log = log or (lambda line: tqdm.write(line))
        self.jsonl_outputs = tuple(jsonl_outputs)
        self.stop_event = threading.Event()
        self.primary = True
        self.mesh: Mesh | None = None
        self.checkpoints: TrainCheckpoints | None = None
        self.writer: MetricsWriter | None = None
        self.lock: WorkdirLock | None = None

    @property
    def tensorboard_dir(self) -> Path:
        return self.workdir / TB_DIR

    def request_stop(self) -> None:
        """Stop after the current step, saving a checkpoint (what SIGTERM does)."""
        self.stop_event.set()

    @contextlib.contextmanager
    def sigterm_stops(self) -> Iterator[None]:
        """While open, SIGTERM asks the run to stop (on the main thread only: signal handlers
        cannot be installed elsewhere)."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        try:
            yield
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def open(self) -> Mesh:
        """Starts JAX's distributed runtime (first), takes the workdir lock (process 0; every
        process stops when it is held), makes the directories, writes config.json (process
        0) and builds the mesh and the checkpoint manager."""
        self.settings.distributed.initialize()
        self.primary = is_primary()
        if not self.primary:  # process 0 alone logs and writes the run's files
            self.log, self.progress = (lambda line: None), False
        self._lock_workdir()
        for sub in (CHECKPOINT_DIR, TB_DIR):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        if self.primary:
            (self.workdir / RESOLVED_CONFIG).write_text(self.settings.resolved_config)
        self.mesh = self.settings.mesh.build()
        self.checkpoints = TrainCheckpoints(
            self.workdir / CHECKPOINT_DIR, self.settings.checkpoint_every, self.settings.keep_checkpoints
        )
        return self.mesh

    def _lock_workdir(self) -> None:
        refusal = None
        if self.primary:
            self.lock = WorkdirLock(self.workdir)
            try:
                self.lock.acquire()
            except WorkdirLockedError as error:
                self.lock, refusal = None, error
            else:
                if self.lock.previous:
                    held = self.lock.previous
                    self.log(
                        f"took over the workdir lock left by pid {held.get('pid', '?')} on host "
                        f"{held.get('host', '?')} (no longer running)"
                    )
        if agree(refusal is not None):
            raise refusal or WorkdirLockedError(f"{self.workdir} is in use by another trainer (process 0 says)")

    def restore_or_init(
        self, abstract: TrainState, shardings: TrainState, init: Callable[[], TrainState]
    ) -> tuple[TrainState, dict[str, Any]]:
        """(state, cursors): the newest readable checkpoint's, else `init()` (cursors {}).
        Then what a killed run wrote for the steps after the restored one is removed, and
        process 0 opens the TensorBoard writer."""
        cursors: dict[str, Any] = {}
        if self.checkpoints.latest_step() is not None:
            _, state, cursors = self.checkpoints.restore_intact(abstract, shardings, warn=self.log)
            self.log(f"resumed from {self.checkpoints.directory} at step {int(state.step)}")
        else:
            state = init()
        if self.primary:
            self._drop_outputs_after(int(state.step))
            self.writer = MetricsWriter(self.tensorboard_dir)
        return state, cursors

    def _drop_outputs_after(self, step: int) -> None:
        """A resumed (or restarted) run redoes the steps after `step`: what a killed run wrote
        for them goes first, so every step appears once in TensorBoard and the JSONL outputs."""
        dropped = truncate_events(self.tensorboard_dir, step)
        dropped += sum(truncate_jsonl(self.workdir / name, step) for name in self.jsonl_outputs)
        if dropped:
            self.log(f"removed {dropped} TensorBoard events / sample records of steps after {step} (redone now)")

    def write_scalars(self, step: int, scalars: dict[str, Any]) -> None:
        """TensorBoard scalars of `step` (process 0 only), flushed."""
        if self.writer is not None:
            self.writer.write(step, scalars)
            self.writer.flush()

    def stopping(self) -> bool:
        """Whether the run stops (SIGTERM, `request_stop`); with several processes, process
        0's answer."""
        return agree(self.stop_event.is_set())

    def progress_bar(self, first: int, desc: str) -> tqdm:
        total = self.settings.steps
        return tqdm(
            total=total,
            initial=min(first, total),
            desc=desc,
            unit="step",
            disable=not self.progress,
            dynamic_ncols=True,
        )

    def summary(self, first: int, last: int) -> TrainSummary:
        return TrainSummary(
            first,
            last,
            self.stop_event.is_set() and last < self.settings.steps,
            self.checkpoints.directory,
            str(self.tensorboard_dir),
            str(self.workdir),
        )

    def close(self, resources: Sequence[Any] = (), quiet: bool = False) -> None:
        """Closes `resources`, then the checkpoints and the writer; with `quiet` (the run is
        failing already) a close error is one logged line, so the run's own error stays the
        one reported."""
        errors = []
        for resource in (*resources, self.checkpoints, self.writer, self.lock):
            if resource is None:
                continue
            try:
                resource.close()
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)
        for error in errors[1 if not quiet else 0 :]:
            self.log(f"while closing: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        if errors and not quiet:
            raise errors[0]
