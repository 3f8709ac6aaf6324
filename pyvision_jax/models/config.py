"""Qwen2.5-VL model settings, read from and written to Hugging Face `config.json` files.

Two layouts exist in the wild:
- the flat Hub layout of the released checkpoints: text fields at the top level,
  `rope_theta` + `rope_scaling.mrope_section`, and a nested `vision_config`;
- the nested layout of transformers v5: `text_config` and `vision_config` sub-dicts,
  with `rope_parameters` holding the theta and the mrope sections.
Both are accepted; `to_hf_dict` writes the flat Hub layout (what vLLM and transformers load).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from pyvision_jax.models.attention import AttentionConfig


class ConfigError(ValueError):
    """A config.json is missing a field or has an invalid value."""


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
        if name not in _PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(_PRESETS)}")
        return _PRESETS[name]()

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with top-level fields changed; `vision=dict(...)` changes vision fields."""
        vision = changes.pop("vision", None)
        if isinstance(vision, Mapping):
            changes["vision"] = dataclasses.replace(self.vision, **vision)
        elif vision is not None:
            changes["vision"] = vision
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ HF I/O

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], source: str = "config.json") -> "ModelConfig":
        """Parse a Hugging Face Qwen2.5-VL config dict (flat Hub or nested v5 layout)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
        model_type = d.get("model_type")
        if model_type not in (None, "qwen2_5_vl"):
            raise ConfigError(f"{source}: model_type is {model_type!r}, expected 'qwen2_5_vl'")
        text = d.get("text_config")
        if text is None:
            text, text_src = d, source
        elif isinstance(text, Mapping):
            text_src = f"{source}: text_config"
        else:
            raise ConfigError(f"{source}: text_config must be an object")
        vision = d.get("vision_config")
        if not isinstance(vision, Mapping):
            raise ConfigError(f"{source}: missing or invalid field 'vision_config'")
        reader = _FieldReader(text, text_src)
        top = _FieldReader(d, source)
        theta, section = _read_rope(text, d, text_src)
        if text.get("use_sliding_window"):
            raise ConfigError(f"{text_src}: use_sliding_window=true is not supported")
        tie = d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        try:
            return cls(
                vocab_size=reader.int("vocab_size"),
                hidden_size=reader.int("hidden_size"),
                intermediate_size=reader.int("intermediate_size"),
                num_hidden_layers=reader.int("num_hidden_layers"),
                num_attention_heads=reader.int("num_attention_heads"),
                num_key_value_heads=reader.int("num_key_value_heads", reader.int("num_attention_heads")),
                rms_norm_eps=reader.float("rms_norm_eps", 1e-6),
                rope_theta=theta,
                mrope_section=section,
                max_position_embeddings=reader.int("max_position_embeddings", 128_000),
                tie_word_embeddings=_as_bool(tie, "tie_word_embeddings", source),
                hidden_act=reader.str("hidden_act", "silu"),
                bos_token_id=reader.optional_int("bos_token_id", top.optional_int("bos_token_id")),
                eos_token_id=reader.int_or_ints("eos_token_id", top.int_or_ints("eos_token_id")),
                pad_token_id=reader.optional_int("pad_token_id", top.optional_int("pad_token_id")),
                image_token_id=top.int("image_token_id", reader.int("image_token_id", 151655)),
                video_token_id=top.int("video_token_id", reader.int("video_token_id", 151656)),
                vision_start_token_id=top.int("vision_start_token_id", 151652),
                vision_end_token_id=top.int("vision_end_token_id", 151653),
                vision_token_id=top.int("vision_token_id", 151654),
                vision=_vision_from_dict(vision, f"{source}: vision_config"),
            )
        except ConfigError as err:
            if str(err).startswith(source):
                raise
            raise ConfigError(f"{source}: {err}") from None

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "ModelConfig":
        """Read `<path>/config.json` (or `path` itself when it is a file)."""
        path = Path(path)
        file = path if path.is_file() else path / "config.json"
        if not file.exists():
            raise ConfigError(f"{file}: no such file (expected a Hugging Face config.json)")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{file}: not valid JSON ({err})") from None
        return cls.from_hf_dict(data, source=str(file))

    def to_hf_dict(self) -> dict[str, Any]:
        """Flat Hub layout, as in the released Qwen2.5-VL checkpoints."""
        v = self.vision
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": "qwen2_5_vl",
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "vision_token_id": self.vision_token_id,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "hidden_act": self.hidden_act,
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": list(self.mrope_section)},
            "sliding_window": self.max_position_embeddings,
            "use_sliding_window": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": self.vocab_size,
            "vision_config": {
                "model_type": "qwen2_5_vl_vision",
                "depth": v.depth,
                "hidden_act": v.hidden_act,
                "hidden_size": v.hidden_size,
                "intermediate_size": v.intermediate_size,
                "num_heads": v.num_heads,
                "in_chans": v.in_channels,
                "in_channels": v.in_channels,
                "out_hidden_size": v.out_hidden_size,
                "patch_size": v.patch_size,
                "spatial_patch_size": v.patch_size,
                "spatial_merge_size": v.spatial_merge_size,
                "temporal_patch_size": v.temporal_patch_size,
                "window_size": v.window_size,
                "fullatt_block_indexes": list(v.fullatt_block_indexes),
                "tokens_per_second": v.tokens_per_second,
            },
        }


# ---------------------------------------------------------------------- parsing


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"invalid field {field!r}: {message}")


def _as_bool(value: Any, name: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: field {name!r} must be true/false, got {value!r}")
    return value


class _FieldReader:
    """Typed field access with errors that name the file and the field."""

    _MISSING = object()

    def __init__(self, data: Mapping[str, Any], source: str):
        self.data, self.source = data, source

    def _get(self, name: str, default: Any) -> Any:
        value = self.data.get(name, default)
        if value is self._MISSING:
            raise ConfigError(f"{self.source}: missing field {name!r}")
        return value

    def _fail(self, name: str, kind: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.source}: field {name!r} must be {kind}, got {value!r}")

    def int(self, name: str, default: Any = _MISSING) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, "an integer", value)
        return value

    def optional_int(self, name: str, default: Any = None) -> int | None:
        value = self.data.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, "an integer or null", value)
        return value

    def int_or_ints(self, name: str, default: Any = None) -> int | tuple[int, ...] | None:
        value = self.data.get(name, default)
        if isinstance(value, (list, tuple)):
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                raise self._fail(name, "an integer or a list of integers", value)
            return tuple(value)
        return self.optional_int(name, value)

    def float(self, name: str, default: Any = _MISSING) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, "a number", value)
        return float(value)

    def str(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise self._fail(name, "a string", value)
        return value

    def int_tuple(self, name: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self._get(name, default)
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in value
        ):
            raise self._fail(name, "a list of integers", value)
        return tuple(value)


def _read_rope(text: Mapping[str, Any], top: Mapping[str, Any], source: str) -> tuple[float, tuple[int, ...]]:
    """rope theta and mrope sections from `rope_scaling`/`rope_theta` or `rope_parameters`."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or top.get("rope_scaling")
    if not isinstance(rope, Mapping):
        raise ConfigError(f"{source}: missing field 'rope_scaling' (or 'rope_parameters') with 'mrope_section'")
    rope_src = f"{source}: rope_scaling" if "rope_scaling" in text else f"{source}: rope_parameters"
    section = _FieldReader(rope, rope_src).int_tuple("mrope_section")
    if len(section) != 3:
        raise ConfigError(f"{rope_src}: field 'mrope_section' must have 3 entries (t, h, w), got {list(section)}")
    theta = rope.get("rope_theta", text.get("rope_theta", top.get("rope_theta", 1_000_000.0)))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{source}: field 'rope_theta' must be a number, got {theta!r}")
    return float(theta), section


def _first_int(value: Any, name: str, source: str) -> int:
    """patch sizes may be written as [p, p] by some exporters."""
    if isinstance(value, (list, tuple)) and value and all(v == value[0] for v in value):
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: field {name!r} must be an integer, got {value!r}")
    return value


def _vision_from_dict(d: Mapping[str, Any], source: str) -> VisionConfig:
    r = _FieldReader(d, source)
    in_channels = d.get("in_channels", d.get("in_chans", 3))
    tokens_per_second = r.float("tokens_per_second", 2)
    return VisionConfig(
        depth=r.int("depth"),
        hidden_size=r.int("hidden_size"),
        intermediate_size=r.int("intermediate_size"),
        num_heads=r.int("num_heads"),
        in_channels=_first_int(in_channels, "in_channels", source),
        patch_size=_first_int(d.get("patch_size", d.get("spatial_patch_size", 14)), "patch_size", source),
        temporal_patch_size=_first_int(d.get("temporal_patch_size", 2), "temporal_patch_size", source),
        spatial_merge_size=r.int("spatial_merge_size", 2),
        window_size=r.int("window_size", 112),
        out_hidden_size=r.int("out_hidden_size"),
        fullatt_block_indexes=r.int_tuple("fullatt_block_indexes", (7, 15, 23, 31)),
        tokens_per_second=int(tokens_per_second) if tokens_per_second.is_integer() else tokens_per_second,
        hidden_act=r.str("hidden_act", "silu"),
    )


# ---------------------------------------------------------------------- presets


def _released_vision(out_hidden_size: int, intermediate_size: int = 3420) -> VisionConfig:
    return VisionConfig(out_hidden_size=out_hidden_size, intermediate_size=intermediate_size)


def _tiny() -> ModelConfig:
    """Random-weight test size; token ids match the tiny tokenizer (contracts.md)."""
    return ModelConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        mrope_section=(2, 3, 3),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=2000,
        eos_token_id=2002,
        pad_token_id=2000,
        image_token_id=2012,
        video_token_id=2013,
        vision_start_token_id=2009,
        vision_end_token_id=2010,
        vision_token_id=2011,
        vision=VisionConfig(
            depth=4,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            fullatt_block_indexes=(1, 3),
            window_size=112,
            tokens_per_second=2,
        ),
    )


def _small() -> ModelConfig:
    """The tiny tokenizer's ids with a decoder that learns the synthetic tasks on 2 CPU
    cores (the shipped SFT checkpoint's size)."""
    tiny = _tiny()
    return tiny.replace(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        mrope_section=(4, 6, 6),
        vision=dataclasses.replace(tiny.vision, out_hidden_size=128),
    )


def _size(
    hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tie: bool, vision_inter: int = 3420
) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tie,
        vision=_released_vision(hidden, vision_inter),
    )


_PRESETS = {
    "tiny": _tiny,
    "small": _small,
    "3b": lambda: _size(2048, 11008, 36, 16, 2, 151936, True),
    "7b": lambda: _size(3584, 18944, 28, 28, 4, 152064, False),
    "32b": lambda: _size(5120, 27648, 64, 40, 8, 152064, False, vision_inter=3456),
    "72b": lambda: _size(8192, 29568, 80, 64, 8, 152064, False, vision_inter=3456),
}
