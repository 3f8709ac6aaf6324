"""Config sections -> the typed, frozen settings of the training loops and of held-out
evaluation. Each config key is read here once; `train/` and `eval/` never see a ConfigDict."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_collections

from pyvision_jax.eval.heldout import HeldoutConfig
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.train.batching import BatchingConfig
from pyvision_jax.train.groups import SelectionConfig
from pyvision_jax.train.mesh import DistributedSettings, MeshSettings
from pyvision_jax.train.run_harness import RunSettings
from pyvision_jax.train.sft import SftSettings
from pyvision_jax.train.sft_data import SyntheticSftSettings
from pyvision_jax.train.state import OptimizerConfig, parse_multiplier
from pyvision_jax.train.step import StepConfig, updates_per_step
from pyvision_jax.train.trainer import GrpoSettings
from pyvision_jax.wiring.config_values import int_tuple, str_tuple
from pyvision_jax.wiring.rollouts import prompts_per_round

EXPORT_DIR = "hf"
VISION_PREFIX = "visual"


def frozen_prefixes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The parameter groups that are not trained: the vision tower under train.freeze_vision."""
    return (VISION_PREFIX,) if config.train.freeze_vision else ()


def selection_config(rl: ml_collections.ConfigDict, seed: int = 0) -> SelectionConfig:
    """Oversample-filter-rank of the `rl` section; `seed` seeds the random reward control."""
    return SelectionConfig(
        batch_groups=int(rl.batch_groups),
        mode=rl.selection_mode,
        rank_by=rl.rank_by,
        min_members=int(rl.min_members),
        drop_groups_with_broken=bool(rl.drop_groups_with_broken),
        normalize_std=bool(rl.normalize_std),
        stats_include_broken=bool(rl.stats_include_broken),
        train_end_reasons=tuple(rl.train_end_reasons),
        require_code_image=bool(rl.require_code_image),
        negative_weight=float(rl.negative_weight),
        batch_unit=rl.batch_unit,
        reward_control=str(rl.reward_control),
        control_seed=seed,
    )


def loss_config(rl: ml_collections.ConfigDict) -> PPOLossConfig:
    """The PPO loss of the `rl` section (dual_clip 0 disables the dual clip)."""
    return PPOLossConfig(
        eps_low=rl.eps_low,
        eps_high=rl.eps_high,
        dual_clip=rl.dual_clip or None,
        aggregation=rl.loss_agg,
        kl_coef=rl.kl_coef,
        kl_estimator=rl.kl_estimator,
        entropy_coef=rl.entropy_coef,
        min_entropy=rl.min_entropy,
        importance_sampling=rl.importance_sampling,
        is_truncation=rl.is_truncation,
    )


def optimizer_config(train: ml_collections.ConfigDict, frozen: tuple[str, ...]) -> OptimizerConfig:
    """AdamW of the `train` section (`lr_multipliers` as "REGEX=FACTOR" strings)."""
    return OptimizerConfig(
        lr=train.lr,
        b1=train.b1,
        b2=train.b2,
        eps=train.eps,
        weight_decay=train.weight_decay,
        grad_clip=train.grad_clip,
        schedule=train.schedule,
        warmup_steps=train.warmup_steps,
        total_steps=train.steps,
        frozen_prefixes=frozen,
        lr_multipliers=tuple(parse_multiplier(text) for text in train.get("lr_multipliers", ())),
        uniform_updates=tuple(str(text) for text in train.get("uniform_updates", ())),
    )


def mini_batches(config: ml_collections.ConfigDict) -> int:
    """Optimizer updates per GRPO step on disjoint mini-batches (train.ppo_mini_batch_groups)."""
    return updates_per_step(int(config.rl.batch_groups), int(config.train.ppo_mini_batch_groups))


def step_config(config: ml_collections.ConfigDict) -> StepConfig:
    """The GRPO train step: the loss, the rollout temperature, chunks, dtypes, remat, updates."""
    c = config
    return StepConfig(
        loss=loss_config(c.rl),
        temperature=c.rollout.temperature,
        logprob_chunk=c.train.logprob_chunk,
        old_logprobs=c.train.old_logprobs,
        ppo_epochs=c.train.ppo_epochs,
        compute_dtype=c.model.compute_dtype,
        frozen_prefixes=frozen_prefixes(c),
        remat=c.model.remat,
        mini_batches=mini_batches(c),
    )


def batching_config(train: ml_collections.ConfigDict, pack: bool | None = None) -> BatchingConfig:
    """SFT batching (and the base of GRPO's): buckets, micro-batch rows, packing."""
    return BatchingConfig(
        int_tuple(train.length_buckets, "train.length_buckets"),
        train.micro_batch,
        bool(train.pack if pack is None else pack),
    )


def grpo_batching(config: ml_collections.ConfigDict) -> BatchingConfig:
    """GRPO batching: mini-batches for the step's updates, loss units of rl.loss_micro_batch,
    vision sizes with room for train.images_per_row of the episode's largest images."""
    return dataclasses.replace(
        batching_config(config.train),
        mini_batches=mini_batches(config),
        loss_unit=int(config.rl.loss_micro_batch),
        images_per_row=int(config.train.images_per_row),
        image_max_pixels=int(config.episode.image_max_pixels),
    )


def run_settings(config: ml_collections.ConfigDict) -> RunSettings:
    """Steps, checkpoints, processes and the mesh of the `train` section, and the resolved
    config that the run writes to WORKDIR/config.json."""
    t = config.train
    distributed = DistributedSettings(
        bool(t.get("distributed", False)),
        str(t.get("coordinator_address", "")),
        int(t.get("num_processes", 0)),
        int(t.get("process_id", -1)),
    )
    return RunSettings(
        steps=int(t.steps),
        checkpoint_every=int(t.checkpoint_every),
        keep_checkpoints=int(t.keep_checkpoints),
        distributed=distributed,
        mesh=MeshSettings(int(t.mesh_data), int(t.mesh_fsdp), int(t.mesh_tensor)),
        resolved_config=config.to_json_best_effort(indent=2, sort_keys=True),
    )


def check_reward_control(rl: ml_collections.ConfigDict) -> None:
    """The entropy-minimisation control trains on the entropy term alone: it needs one."""
    if rl.reward_control == "entropy_min" and not rl.entropy_coef < 0:
        raise ValueError(
            f"rl.reward_control='entropy_min' trains only the entropy term and needs rl.entropy_coef < 0 "
            f"(got {rl.entropy_coef}), e.g. --config.rl.entropy_coef=-1.0"
        )


def grpo_settings(config: ml_collections.ConfigDict) -> GrpoSettings:
    c = config
    check_reward_control(c.rl)
    return GrpoSettings(
        run=run_settings(c),
        selection=selection_config(c.rl, int(c.seed)),
        optimizer=optimizer_config(c.train, frozen_prefixes(c)),
        step=step_config(c),
        batching=grpo_batching(c),
        group_size=int(c.rl.group_size),
        prompts_per_round=prompts_per_round(c),
        max_gen_rounds=int(c.rl.max_gen_rounds),
        sample_groups_per_step=int(c.train.sample_groups_per_step),
        seed=int(c.seed),
    )


def export_dir(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Path:
    """Where an SFT run's final weights go: `sft.export_dir`, else WORKDIR/hf."""
    return Path(config.sft.export_dir or Path(workdir) / EXPORT_DIR).absolute()


def sft_settings(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> SftSettings:
    c = config
    step = StepConfig(
        logprob_chunk=c.train.logprob_chunk, compute_dtype=c.model.compute_dtype, frozen_prefixes=frozen_prefixes(c)
    )
    return SftSettings(
        run=run_settings(c),
        optimizer=optimizer_config(c.train, frozen_prefixes(c)),
        step=step,
        batching=batching_config(c.train, pack=False),
        batch_size=int(c.sft.batch_size),
        export_dir=export_dir(c, workdir),
        export_dtype=c.sft.export_dtype or None,
        seed=int(c.seed),
    )


def synthetic_sft_settings(config: ml_collections.ConfigDict) -> SyntheticSftSettings:
    s = config.sft
    return SyntheticSftSettings(
        per_kind=int(s.synthetic_per_kind),
        seed=int(s.synthetic_seed),
        kinds=str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds"),
        rollouts_per_task=int(s.rollouts_per_task),
        guess_share=float(s.guess_share),
        wrong_share=float(s.wrong_share),
        careful_share=float(s.careful_share),
        wording_by_options=bool(s.wording_by_options),
    )


def heldout_config(config: ml_collections.ConfigDict) -> HeldoutConfig:
    """The held-out set of `eval.heldout_*`, checked against the seeds training draws from."""
    return HeldoutConfig(
        int(config.eval.heldout_per_kind),
        int(config.eval.heldout_seed),
        int(config.eval.heldout_k),
        training_seeds=(
            ("data.synthetic_seed", int(config.data.synthetic_seed)),
            ("sft.synthetic_seed", int(config.sft.synthetic_seed)),
        ),
        distributed=bool(config.train.get("distributed", False)),
    )
