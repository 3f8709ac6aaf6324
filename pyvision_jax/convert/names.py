"""Pure mapping between Hugging Face Qwen2.5-VL tensor names/layouts and the Flax params tree.

The params tree mirrors the Hub checkpoint names, except that the repeated layers are
stacked (the model scans over them): every tensor of ``model.layers.{i}`` and
``visual.blocks.{i}`` is slice ``i`` of one leaf with a leading layers axis, e.g.
``visual.blocks.3.attn.qkv.weight`` <-> slice 3 of ``('visual', 'blocks', 'attn', 'qkv', 'kernel')``.
A tensor's place is its *slot*: (params path, layer index or None). Only names and shapes
live here; moving bytes is ``safetensors_io``'s job.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

ParamPath = tuple[str | int, ...]
Shape = tuple[int, ...]
Slot = tuple[ParamPath, int | None]

STACKED_MODULES = (("model", "layers"), ("visual", "blocks"))
"""Module paths whose numbered children are stacked into one leaf per tensor."""

_NORM_MODULES = frozenset({"norm", "norm1", "norm2", "ln_q", "input_layernorm", "post_attention_layernorm"})
_V5_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))
_LM_HEAD = "lm_head.weight"


class TensorKind(enum.Enum):
    """How an HF tensor's layout relates to its Flax leaf."""

    LINEAR_WEIGHT = "linear_weight"  # [out, in] -> kernel [in, out]
    CONV_WEIGHT = "conv_weight"  # [D, C, T, P, P] -> kernel [C*T*P*P, D]
    EMBEDDING = "embedding"  # [V, D] -> embedding [V, D]
    NORM_SCALE = "norm_scale"  # [D] -> scale [D]
    BIAS = "bias"  # [D] -> bias [D]


def hub_name(name: str) -> str:
    """Rewrites a transformers-v5 in-memory name (``model.visual.*``, ``model.language_model.*``)
    to its Hub checkpoint name; Hub names pass through unchanged."""
    for v5_prefix, hub_prefix in _V5_PREFIXES:
        if name.startswith(v5_prefix):
            return hub_prefix + name[len(v5_prefix) :]
    return name


def tensor_kind(name: str) -> TensorKind:
    """Classifies a Hub tensor name by the layout transform it needs."""
    *modules, leaf = name.split(".")
    if leaf == "bias":
        return TensorKind.BIAS
    if leaf != "weight" or not modules:
        raise ValueError(f"not a Qwen2.5-VL parameter name: {name!r}")
    if modules[-1] == "embed_tokens":
        return TensorKind.EMBEDDING
    if modules[-1] in _NORM_MODULES:
        return TensorKind.NORM_SCALE
    if modules[-2:] == ["patch_embed", "proj"]:
        return TensorKind.CONV_WEIGHT
    return TensorKind.LINEAR_WEIGHT


_FLAX_LEAF = {
    TensorKind.LINEAR_WEIGHT: "kernel",
    TensorKind.CONV_WEIGHT: "kernel",
    TensorKind.EMBEDDING: "embedding",
    TensorKind.NORM_SCALE: "scale",
    TensorKind.BIAS: "bias",
}
_HF_LEAF = {"kernel": "weight", "embedding": "weight", "scale": "weight", "bias": "bias"}


def flax_slot(name: str) -> Slot:
    """(params-tree path, layer index) of a Hub (or v5) tensor name: a stacked layer's
    tensor is slice ``layer`` of the leaf at the path (its index dropped from the path);
    other tensors have layer None. Other numeric segments become int keys."""
    name = hub_name(name)
    *modules, _ = name.split(".")
    keys: list[str | int] = [int(m) if m.isdigit() else m for m in modules]
    layer = None
    if tuple(keys[:2]) in STACKED_MODULES and len(keys) > 2 and isinstance(keys[2], int):
        layer = keys.pop(2)
    return (*keys, _FLAX_LEAF[tensor_kind(name)]), layer


def flax_path(name: str) -> ParamPath:
    """Params-tree path of a Hub (or v5) tensor name (see ``flax_slot``)."""
    return flax_slot(name)[0]


def hf_name(path: ParamPath, layer: int | None = None) -> str:
    """Hub tensor name of a params-tree path and layer index (inverse of ``flax_slot``)."""
    *modules, leaf = path
    if leaf not in _HF_LEAF:
        raise ValueError(f"params path {path!r} does not end in one of {sorted(_HF_LEAF)}")
    stacked = tuple(modules[:2]) in STACKED_MODULES
    if stacked != (layer is not None):
        raise ValueError(
            f"params path {path!r} needs a layer index exactly when it is under "
            f"one of {STACKED_MODULES} (got layer={layer})"
        )
    if stacked:
        modules = [*modules[:2], layer, *modules[2:]]
    return ".".join(str(m) for m in modules) + "." + _HF_LEAF[leaf]


def flax_shape(name: str, hf_shape: Shape) -> Shape:
    """Shape of the Flax leaf holding HF tensor ``name`` of shape ``hf_shape``."""
    kind = tensor_kind(hub_name(name))
    if kind is TensorKind.LINEAR_WEIGHT:
        out_features, in_features = hf_shape
        return (in_features, out_features)
    if kind is TensorKind.CONV_WEIGHT:
        return (math.prod(hf_shape[1:]), hf_shape[0])
    return tuple(hf_shape)


def _text_and_vision(hf_config: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Text and vision fields of a config.json in the flat Hub or nested transformers-v5 layout."""
    text = {**hf_config, **hf_config.get("text_config", {})}
    if "vision_config" not in hf_config:
        raise ValueError("config has no 'vision_config'; not a Qwen2.5-VL config")
    return text, hf_config["vision_config"]


def ties_word_embeddings(hf_config: Mapping[str, Any]) -> bool:
    """Whether lm_head shares the token embedding (root or text_config flag, as transformers reads it)."""
    return bool(hf_config.get("tie_word_embeddings") or hf_config.get("text_config", {}).get("tie_word_embeddings"))


def checkpoint_shapes(hf_config: Mapping[str, Any]) -> dict[str, Shape]:
    """Every Hub tensor name of a Qwen2.5-VL checkpoint with its shape, derived from config.json.

    ``lm_head.weight`` is omitted when word embeddings are tied.
    """
    text, vision = _text_and_vision(hf_config)
    try:
        d, inter = text["hidden_size"], text["intermediate_size"]
        heads, vocab, layers = text["num_attention_heads"], text["vocab_size"], text["num_hidden_layers"]
        kv_heads = text.get("num_key_value_heads") or heads
        vd, vinter, depth = vision["hidden_size"], vision["intermediate_size"], vision["depth"]
        out_d, patch = vision["out_hidden_size"], vision["patch_size"]
    except KeyError as err:
        raise ValueError(f"config.json lacks required field {err.args[0]!r}") from None
    head_dim = d // heads
    channels = vision.get("in_channels", vision.get("in_chans", 3))
    temporal = vision.get("temporal_patch_size", 2)
    merged = vd * vision.get("spatial_merge_size", 2) ** 2

    shapes: dict[str, Shape] = {"visual.patch_embed.proj.weight": (vd, channels, temporal, patch, patch)}
    for i in range(depth):
        block = f"visual.blocks.{i}"
        shapes |= {
            f"{block}.norm1.weight": (vd,),
            f"{block}.norm2.weight": (vd,),
            f"{block}.attn.qkv.weight": (3 * vd, vd),
            f"{block}.attn.qkv.bias": (3 * vd,),
            f"{block}.attn.proj.weight": (vd, vd),
            f"{block}.attn.proj.bias": (vd,),
            f"{block}.mlp.gate_proj.weight": (vinter, vd),
            f"{block}.mlp.gate_proj.bias": (vinter,),
            f"{block}.mlp.up_proj.weight": (vinter, vd),
            f"{block}.mlp.up_proj.bias": (vinter,),
            f"{block}.mlp.down_proj.weight": (vd, vinter),
            f"{block}.mlp.down_proj.bias": (vd,),
        }
    shapes |= {
        "visual.merger.ln_q.weight": (vd,),
        "visual.merger.mlp.0.weight": (merged, merged),
        "visual.merger.mlp.0.bias": (merged,),
        "visual.merger.mlp.2.weight": (out_d, merged),
        "visual.merger.mlp.2.bias": (out_d,),
        "model.embed_tokens.weight": (vocab, d),
    }
    for i in range(layers):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.input_layernorm.weight": (d,),
            f"{layer}.post_attention_layernorm.weight": (d,),
            f"{layer}.self_attn.q_proj.weight": (heads * head_dim, d),
            f"{layer}.self_attn.q_proj.bias": (heads * head_dim,),
            f"{layer}.self_attn.k_proj.weight": (kv_heads * head_dim, d),
            f"{layer}.self_attn.k_proj.bias": (kv_heads * head_dim,),
            f"{layer}.self_attn.v_proj.weight": (kv_heads * head_dim, d),
            f"{layer}.self_attn.v_proj.bias": (kv_heads * head_dim,),
            f"{layer}.self_attn.o_proj.weight": (d, heads * head_dim),
            f"{layer}.mlp.gate_proj.weight": (inter, d),
            f"{layer}.mlp.up_proj.weight": (inter, d),
            f"{layer}.mlp.down_proj.weight": (d, inter),
        }
    shapes["model.norm.weight"] = (d,)
    if not ties_word_embeddings(hf_config):
        shapes[_LM_HEAD] = (vocab, d)
    return shapes


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """One params leaf: its shape in the Flax tree and the Hub tensors it holds (one per
    layer, in layer order, for a stacked leaf)."""

    shape: Shape
    tensors: tuple[str, ...]
    stacked: bool


def param_leaves(hf_config: Mapping[str, Any]) -> dict[ParamPath, LeafSpec]:
    """Every leaf of the Flax params tree of a checkpoint's config, in checkpoint order."""
    grouped: dict[ParamPath, dict[int | None, str]] = {}
    shapes: dict[ParamPath, Shape] = {}
    for name, hf_shape in checkpoint_shapes(hf_config).items():
        path, layer = flax_slot(name)
        grouped.setdefault(path, {})[layer] = name
        shapes[path] = flax_shape(name, hf_shape)
    leaves = {}
    for path, by_layer in grouped.items():
        stacked = None not in by_layer
        layers = sorted(by_layer) if stacked else [None]
        shape = (len(layers), *shapes[path]) if stacked else shapes[path]
        leaves[path] = LeafSpec(shape, tuple(by_layer[i] for i in layers), stacked)
    return leaves


def is_tied_lm_head(name: str, hf_config: Mapping[str, Any]) -> bool:
    """A stored ``lm_head.weight`` that a tied config ignores (some tied checkpoints still carry it)."""
    return hub_name(name) == _LM_HEAD and ties_word_embeddings(hf_config)
