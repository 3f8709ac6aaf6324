"""Qwen2.5-VL architecture settings, checked on construction; the named sizes are in
`models.presets`, the Hugging Face config.json form in `convert.hf_config`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from pyvision_jax.models.attention import AttentionConfig
from pyvision_jax.models.presets import PRESETS


class ModelConfigError(ValueError):
    """A model architecture (or the config.json describing it) is missing a field or has an
    invalid value."""


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The Qwen2.5-VL vision transformer (ViT with window attention and a patch merger)."""

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    tokens_per_second: float = 2
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen2.5-VL: text decoder fields at the top level, vision tower in `vision`."""

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)
    max_position_embeddings: int = 128_000
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    pad_token_id: int | None = None
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    vision_token_id: int = 151654
    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    attention: AttentionConfig = AttentionConfig()
    """Not part of config.json: the attention kernel (config key model.attention)."""

    def __post_init__(self) -> None:
        _check(
            self.hidden_size % self.num_attention_heads == 0,
            "hidden_size",
            f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}",
        )
        _check(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            f"num_attention_heads={self.num_attention_heads} is not a multiple of {self.num_key_value_heads}",
        )
        _check(
            2 * sum(self.mrope_section) == self.head_dim,
            "mrope_section",
            f"{list(self.mrope_section)} must sum to head_dim/2 = {self.head_dim // 2}",
        )
        _check(
            self.vision.hidden_size % self.vision.num_heads == 0,
            "vision_config.hidden_size",
            f"{self.vision.hidden_size} is not divisible by num_heads={self.vision.num_heads}",
        )
        _check(
            self.vision.head_dim % 4 == 0,
            "vision_config.num_heads",
            f"vision head_dim {self.vision.head_dim} must be a multiple of 4 (2-D rope)",
        )
        _check(
            self.vision.out_hidden_size == self.hidden_size,
            "vision_config.out_hidden_size",
            f"{self.vision.out_hidden_size} must equal the text hidden_size {self.hidden_size}",
        )
        window_units = self.vision.window_size // (self.vision.patch_size * self.vision.spatial_merge_size)
        _check(
            window_units >= 1,
            "vision_config.window_size",
            f"{self.vision.window_size} is smaller than patch_size*spatial_merge_size",
        )
        for name in ("hidden_act",):
            _check(getattr(self, name) == "silu", name, f"only 'silu' is supported, got {getattr(self, name)!r}")
        _check(
            self.vision.hidden_act == "silu",
            "vision_config.hidden_act",
            f"only 'silu' is supported, got {self.vision.hidden_act!r}",
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ presets

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        """Released sizes ("3b", "7b", "32b", "72b") and a random-weight test size ("tiny")."""
        if name not in PRESETS:
            raise ModelConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls().replace(**PRESETS[name])

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with top-level fields changed; `vision=dict(...)` changes vision fields."""
        vision = changes.pop("vision", None)
        if isinstance(vision, Mapping):
            changes["vision"] = dataclasses.replace(self.vision, **vision)
        elif vision is not None:
            changes["vision"] = vision
        return dataclasses.replace(self, **changes)


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ModelConfigError(f"invalid field {field!r}: {message}")
