"""The smallest vision layout sizes of the engine's prefill and extension blocks, per (kind,
batch size), so that the number and sizes of a block's images do not change its compiled
shape.

A block's vision layout has a number of windows and of merged tokens, each rounded up to a
``bucket_size``; both are raised to the block's floor, and a block needing more raises the
floor (floors never shrink), so each (kind, batch size) compiles a new vision shape only when
its images exceed every earlier block's. ``image_floors`` fixes the floors up front from the
image tokens a row is expected to hold, which makes the vision shapes a known set that
``engine_warm_up`` compiles before serving.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pyvision_jax.models import ModelConfig, ModelInputs, prepare_inputs
from pyvision_jax.models.vision import image_room, window_units

Floors = dict[tuple[str, int], tuple[int, int]]  # ("prefill" | "extend", batch) -> (windows, merged)


def image_floors(config: ModelConfig, batch_sizes: Sequence[int], image_tokens_per_row: int) -> Floors:
    """Floors with room for `image_tokens_per_row` merged image tokens in every row of a
    block, as one square image per row."""
    return {
        (kind, batch): image_room(config.vision, batch, image_tokens_per_row)
        for kind in ("prefill", "extend")
        for batch in batch_sizes
    }


class VisionFloors:
    """The floors of one engine, raised by every block that needs more."""

    def __init__(self, config: ModelConfig, floors: Mapping[tuple[str, int], tuple[int, int]] | None = None):
        self.config = config
        self.floors: Floors = dict(floors or {})

    def prepare(self, kind: tuple[str, int], inputs: dict) -> tuple[ModelInputs, np.ndarray]:
        """``prepare_inputs`` of a block at its floors, raising them to its layout's sizes."""
        model_inputs, deltas = prepare_inputs(self.config, inputs, *self.floors.get(kind, (1, 1)))
        if model_inputs.layout is not None:
            vision = self.config.vision
            slots_per_window = window_units(vision) ** 2 * vision.merge_unit
            self.floors[kind] = (
                model_inputs.layout.patch_index.shape[0] // slots_per_window,
                model_inputs.layout.merged_index.shape[0],
            )
        return model_inputs, deltas
