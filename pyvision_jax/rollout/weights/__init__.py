"""New weights from the trainer to the engines.

In process (the trainer and the engine share a process): the trainer hands the params pytree
to the engine's `update_weights(weights, version)` directly, or through a `WeightsInbox` that a
background rollout thread polls between batches (`in_process`); nothing touches the disk.

Across processes (a rollout fleet): the trainer's `WeightsPublisher` (`publisher`, the
shared-filesystem `background.WeightTransport`, run off the training thread by
`background.BackgroundPublisher`) writes each version under one shared directory in the format
of `version_dirs` and announces it through the trajectory queue; each worker's watcher
(`watchers`) compares the announcement with its engine's version between groups and loads the
new version (`loading`). `named_params` turns HF-named tensors into the engine's params tree.
"""

from pyvision_jax.rollout.weights.in_process import WeightsInbox, update_engines
from pyvision_jax.rollout.weights.loading import load_latest, load_weights, open_hf_tensors
from pyvision_jax.rollout.weights.publisher import WeightsPublisher
from pyvision_jax.rollout.weights.version_dirs import (
    IncompleteWeightsError,
    WeightsVersion,
    check_complete,
    complete_versions,
    latest_complete,
)
from pyvision_jax.rollout.weights.watchers import HfTensorsWatcher, WeightsWatcher

__all__ = [
    "HfTensorsWatcher",
    "IncompleteWeightsError",
    "WeightsInbox",
    "WeightsPublisher",
    "WeightsVersion",
    "WeightsWatcher",
    "check_complete",
    "complete_versions",
    "latest_complete",
    "load_latest",
    "load_weights",
    "open_hf_tensors",
    "update_engines",
]
