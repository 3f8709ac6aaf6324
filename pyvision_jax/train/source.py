"""What the trainer needs from rollouts: a source of scored groups that takes new weights.

The trainer never knows the topology behind a source. `rollout.sources` implements it three
ways (in-process synchronous generation, an in-process background thread, an external fleet
over a queue); `wiring.group_source` picks one from the config.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from pyvision_jax.agent.trajectory import TrajectoryGroup


class GroupSource(Protocol):
    holds_params: bool
    """True when the source keeps references to the params it is given (an in-process
    engine), so the train step must not donate them."""

    def start(self, params: Any, version: int, state: Mapping[str, Any]) -> None:
        """Begin from `state` (what `state()` returned at the checkpoint resumed, {} for a new
        run) with the trainer's params of `version`."""

    def collect(self, count: int, stop: threading.Event) -> list[TrajectoryGroup]:
        """`count` scored groups (fewer only when `stop` is set)."""

    def wants_params(self, version: int, *, final: bool = False) -> bool:
        """Whether `publish(params, version, final=final)` reads the params (a fleet exports
        only every few steps; a multi-process run gathers them only then)."""

    def publish(self, params: Any, version: int, *, final: bool = False) -> None:
        """New trainer params of `version` (`final`: the run's last step); None when
        `wants_params` said no."""

    def state(self) -> dict[str, Any]:
        """The source's resumable position, saved with each checkpoint."""

    def receipt(self) -> Any:
        """What was collected since the previous receipt (the trainer keeps it until the
        checkpoint of the steps that trained it is on disk)."""

    def acknowledge(self, receipt: Any) -> None:
        """The groups of `receipt` are trained and checkpointed: release them for good."""

    def stats(self) -> dict[str, float]:
        """Counters named in `run_logs.metric_names.SOURCE_STATS` (e.g. groups dropped and why)."""

    def close(self) -> None: ...
