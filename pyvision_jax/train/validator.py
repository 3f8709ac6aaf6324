"""What the trainer needs from validation during training: evaluate the current params at a
step, once.

The trainer asks `pending(step)` after restoring (the step it resumes from: validation before
training at step 0, or one a killed run left unfinished) and after every step; when it is
pending, the trainer saves a checkpoint of that step first (so a run killed mid-validation
resumes at the same params and finishes the same validation), then calls `validate`. On
resume it calls `forget_after(step)` first: validations of later steps were made with params
the resumed run is about to recompute. `eval.training_validation` implements it;
`wiring.training_validation` builds it from the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Validator(Protocol):
    def pending(self, step: int) -> bool:
        """Whether `step` is a validation step whose validation has not finished."""

    def validate(self, params: Any, step: int) -> Mapping[str, float]:
        """Evaluates `params` (the policy after `step` updates) and records it (its outputs and
        TensorBoard scalars, each written once); returns the scalars."""

    def forget_after(self, step: int) -> None:
        """Removes what validations of steps after `step` recorded."""
