"""The 7B recipe's train-step settings, read from configs/pyvision_image_7b.py (ml_collections)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.train.state import OptimizerConfig
from pyvision_jax.train.step import StepConfig

CONFIG_7B = Path(__file__).resolve().parents[2] / "configs" / "pyvision_image_7b.py"


@dataclasses.dataclass(frozen=True)
class StepRecipe:
    """What the 7B config sets for its train step (besides the model's size and the mesh)."""

    param_dtype: str
    compute_dtype: str
    remat: str
    block_q: int
    block_kv: int
    logprob_chunk: int
    temperature: float
    loss: PPOLossConfig
    optimizer: OptimizerConfig

    def step_config(self) -> StepConfig:
        return StepConfig(
            loss=self.loss,
            temperature=self.temperature,
            logprob_chunk=self.logprob_chunk,
            old_logprobs="current",
            compute_dtype=self.compute_dtype,
            frozen_prefixes=self.optimizer.frozen_prefixes,
            remat=self.remat,
        )

    def attention(self, implementation: str) -> AttentionConfig:
        return AttentionConfig(implementation, self.block_q, self.block_kv)


def load_config(path: Path = CONFIG_7B):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 (a config file of this repo)
    return namespace["get_config"]()


def step_recipe(path: Path = CONFIG_7B) -> StepRecipe:
    c = load_config(path)
    loss = PPOLossConfig(
        eps_low=c.rl.eps_low,
        eps_high=c.rl.eps_high,
        dual_clip=c.rl.dual_clip or None,
        aggregation=c.rl.loss_agg,
        kl_coef=c.rl.kl_coef,
        entropy_coef=c.rl.entropy_coef,
    )
    optimizer = OptimizerConfig(
        lr=c.train.lr,
        weight_decay=c.train.weight_decay,
        grad_clip=c.train.grad_clip,
        frozen_prefixes=("visual",) if c.train.freeze_vision else (),
    )
    return StepRecipe(
        param_dtype=c.model.param_dtype,
        compute_dtype=c.model.compute_dtype,
        remat=c.model.remat,
        block_q=c.model.attention_block_q,
        block_kv=c.model.attention_block_kv,
        logprob_chunk=c.train.logprob_chunk,
        temperature=c.rollout.temperature,
        loss=loss,
        optimizer=optimizer,
    )
