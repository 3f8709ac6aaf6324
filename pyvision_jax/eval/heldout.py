"""Held-out evaluation around a training run: what it is (`HeldoutConfig`) and what one
evaluation found (`HeldoutResult`). The tasks come from a synthetic seed that neither RL
(`data.synthetic_seed`) nor SFT (`sft.synthetic_seed`) uses; `pyvision_jax.wiring.heldout`
runs the evaluations into WORKDIR/heldout/.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

HELDOUT_DIR = "heldout"


@dataclasses.dataclass(frozen=True)
class HeldoutConfig:
    """`per_kind` tasks of each synthetic kind (0: no held-out evaluation), generated with
    `seed`, `k` rollouts each (config keys eval.heldout_per_kind, eval.heldout_seed,
    eval.heldout_k). `training_seeds` names the seeds training draws from; the held-out seed
    must be none of them."""

    per_kind: int
    seed: int
    k: int
    training_seeds: tuple[tuple[str, int], ...] = ()
    distributed: bool = False

    def __post_init__(self) -> None:
        if self.per_kind < 0 or (self.per_kind and self.k < 1):
            raise ValueError(
                f"eval.heldout_per_kind must be >= 0 and eval.heldout_k >= 1, got {self.per_kind} and {self.k}"
            )
        if self.per_kind and self.distributed:
            raise ValueError(
                "eval.heldout_per_kind needs a single-process run (train.distributed is set); "
                "evaluate the checkpoint afterwards with launch/eval.py"
            )
        clash = [name for name, seed in self.training_seeds if seed == self.seed]
        if self.per_kind and clash:
            raise ValueError(
                f"eval.heldout_seed={self.seed} is also {clash[0]}: held-out tasks must come "
                "from a seed never trained on"
            )


@dataclasses.dataclass(frozen=True)
class HeldoutResult:
    """Headline figures of one held-out evaluation."""

    accuracy: float
    tool_calls: float
    out_dir: Path

    @classmethod
    def from_results(cls, results: dict[str, Any], out_dir: Path) -> "HeldoutResult":
        return cls(float(results["accuracy"]), float(results["tool_calls"]["mean"]), out_dir)

    def summary(self) -> str:
        return f"accuracy {self.accuracy:.3f}, tool calls {self.tool_calls:.2f}"
