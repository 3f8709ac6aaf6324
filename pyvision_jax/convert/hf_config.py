"""Hugging Face `config.json` of Qwen2.5-VL: the one place it is read, parsed, written.

Two layouts exist in the wild:
- the flat Hub layout of the released checkpoints: text fields at the top level,
  `rope_theta` + `rope_scaling.mrope_section`, and a nested `vision_config`;
- the nested layout of transformers v5: `text_config` and `vision_config` sub-dicts,
  with `rope_parameters` holding the theta and the mrope sections.
Both are read; `hf_config_dict` writes the flat Hub layout (what vLLM and transformers load).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from pyvision_jax.models.config import ModelConfig, ModelConfigError, VisionConfig

CONFIG_FILE = "config.json"


def config_path(path: str | os.PathLike) -> Path:
    """`<path>/config.json`, or `path` itself when it is a file."""
    path = Path(path)
    return path if path.is_file() else path / CONFIG_FILE


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The raw config.json of an HF directory (or the file `path`): FileNotFoundError when
    missing, ModelConfigError when not JSON."""
    file = config_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file (expected a Hugging Face config.json)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ModelConfigError(f"{file}: not valid JSON ({err})") from None


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of `<path>/config.json` (or of the file `path`)."""
    return model_config_from_hf(read_hf_config(path), source=str(config_path(path)))


def write_hf_config(directory: str | os.PathLike, hf_config: Mapping[str, Any], dtype: str | None = None) -> Path:
    """Writes `hf_config` as `<directory>/config.json`, the stored `dtype` (when given) under
    `torch_dtype` and under every dtype key already there (transformers v5 writes `dtype`,
    nested configs their own); returns the file."""
    hf_config = json.loads(json.dumps(hf_config))
    if dtype is not None:
        hf_config["torch_dtype"] = dtype
        for holder in (hf_config, hf_config.get("text_config"), hf_config.get("vision_config")):
            if isinstance(holder, dict):
                for key in ("dtype", "torch_dtype"):
                    if key in holder:
                        holder[key] = dtype
    file = Path(directory) / CONFIG_FILE
    file.write_text(json.dumps(hf_config, indent=2) + "\n")
    return file


def model_config_from_hf(d: Mapping[str, Any], source: str = CONFIG_FILE) -> ModelConfig:
    """Parse a Hugging Face Qwen2.5-VL config dict (flat Hub or nested v5 layout)."""
    if not isinstance(d, Mapping):
        raise ModelConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type")
    if model_type not in (None, "qwen2_5_vl"):
        raise ModelConfigError(f"{source}: model_type is {model_type!r}, expected 'qwen2_5_vl'")
    text = d.get("text_config")
    if text is None:
        text, text_src = d, source
    elif isinstance(text, Mapping):
        text_src = f"{source}: text_config"
    else:
        raise ModelConfigError(f"{source}: text_config must be an object")
    vision = d.get("vision_config")
    if not isinstance(vision, Mapping):
        raise ModelConfigError(f"{source}: missing or invalid field 'vision_config'")
    reader = _FieldReader(text, text_src)
    top = _FieldReader(d, source)
    theta, section = _read_rope(text, d, text_src)
    if text.get("use_sliding_window"):
        raise ModelConfigError(f"{text_src}: use_sliding_window=true is not supported")
    tie = d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    try:
        return ModelConfig(
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
    except ModelConfigError as err:
        if str(err).startswith(source):
            raise
        raise ModelConfigError(f"{source}: {err}") from None


def hf_config_dict(config: ModelConfig) -> dict[str, Any]:
    """Flat Hub layout, as in the released Qwen2.5-VL checkpoints."""
    v = config.vision
    eos = list(config.eos_token_id) if isinstance(config.eos_token_id, tuple) else config.eos_token_id
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": config.pad_token_id,
        "vision_start_token_id": config.vision_start_token_id,
        "vision_end_token_id": config.vision_end_token_id,
        "vision_token_id": config.vision_token_id,
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "hidden_act": config.hidden_act,
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "max_window_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": list(config.mrope_section)},
        "sliding_window": config.max_position_embeddings,
        "use_sliding_window": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": config.vocab_size,
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


def _as_bool(value: Any, name: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise ModelConfigError(f"{source}: field {name!r} must be true/false, got {value!r}")
    return value


class _FieldReader:
    """Typed field access with errors that name the file and the field."""

    _MISSING = object()

    def __init__(self, data: Mapping[str, Any], source: str):
        self.data, self.source = data, source

    def _get(self, name: str, default: Any) -> Any:
        value = self.data.get(name, default)
        if value is self._MISSING:
            raise ModelConfigError(f"{self.source}: missing field {name!r}")
        return value

    def _fail(self, name: str, kind: str, value: Any) -> ModelConfigError:
        return ModelConfigError(f"{self.source}: field {name!r} must be {kind}, got {value!r}")

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
        raise ModelConfigError(f"{source}: missing field 'rope_scaling' (or 'rope_parameters') with 'mrope_section'")
    rope_src = f"{source}: rope_scaling" if "rope_scaling" in text else f"{source}: rope_parameters"
    section = _FieldReader(rope, rope_src).int_tuple("mrope_section")
    if len(section) != 3:
        raise ModelConfigError(f"{rope_src}: field 'mrope_section' must have 3 entries (t, h, w), got {list(section)}")
    theta = rope.get("rope_theta", text.get("rope_theta", top.get("rope_theta", 1_000_000.0)))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ModelConfigError(f"{source}: field 'rope_theta' must be a number, got {theta!r}")
    return float(theta), section


def _first_int(value: Any, name: str, source: str) -> int:
    """patch sizes may be written as [p, p] by some exporters."""
    if isinstance(value, (list, tuple)) and value and all(v == value[0] for v in value):
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{source}: field {name!r} must be an integer, got {value!r}")
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
