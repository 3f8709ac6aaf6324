"""A rollout worker's side of the shared-filesystem transport: between groups, loads the
version announced on the queue into its engine when it differs from the engine's."""

from __future__ import annotations

import logging
from typing import Any

from pyvision_jax.agent.engine import Engine
from pyvision_jax.rollout.queue import TrajectoryQueue
from pyvision_jax.rollout.weights.loading import FrozenTower, load_weights, open_hf_tensors
from pyvision_jax.rollout.weights.version_dirs import IncompleteWeightsError, frozen_part

logger = logging.getLogger(__name__)


class WeightsWatcher:
    """A worker's side: loads the announced version into its engine when it changes.

    `poll()` is cheap (one queue read) and is called between groups; it loads only complete
    versions and leaves the engine untouched when the announced one is not (yet) complete.
    The frozen tower is read once and reused while the versions name the same one.
    """

    def __init__(self, queue: TrajectoryQueue, engine: Engine, *, dtype: Any = None) -> None:
        self.queue = queue
        self.engine = engine
        self.dtype = dtype
        self.frozen: FrozenTower | None = None

    def poll(self) -> int | None:
        """Loads the announced weights if their version differs from the engine's; returns
        the version loaded, or None when nothing was loaded."""
        announced = self.queue.latest_weights()
        if announced is None or announced.version == self.engine.version:
            return None
        try:
            version, weights = self._read(announced.location)
        except IncompleteWeightsError as error:
            logger.warning("announced weights version %d not loadable yet: %s", announced.version, error)
            return None
        self.engine.update_weights(weights, version)
        logger.info("loaded weights version %d from %s", version, announced.location)
        return version

    def _read(self, location: str) -> tuple[int, Any]:
        """(version, params) of the complete version at `location`, keeping its frozen tower."""
        frozen = frozen_part(location)
        version, _, params = load_weights(location, self.dtype, self.frozen)
        if frozen.name is not None:
            self.frozen = FrozenTower(frozen.name, {group: params[group] for group in frozen.groups})
        return version, params


class HfTensorsWatcher(WeightsWatcher):
    """A `WeightsWatcher` for engines that take HF-layout (name, tensor) pairs (vLLM): the
    announced version's safetensors go to `engine.update_weights` as stored, with no Flax
    params in between."""

    def _read(self, location: str) -> tuple[int, Any]:
        return open_hf_tensors(location)
