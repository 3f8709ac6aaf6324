"""Test-side reference: a random tiny transformers Qwen2.5-VL and its weights as Flax params."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.models.config import ModelConfig


def build_hf_model(config: ModelConfig, out_dir: Path, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    """Random fp32 eager-attention model with O(1) logits, saved with save_pretrained."""
    torch.manual_seed(seed)
    hf_config = Qwen2_5_VLConfig(**hf_config_dict(config))
    model = Qwen2_5_VLForConditionalGeneration(hf_config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("weight"):  # norms
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1] if p.ndim == 2 else p[0].numel()))
    model.save_pretrained(out_dir)
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        out_dir, attn_implementation="eager", dtype=torch.float32
    )
    return loaded.eval()


def hf_dir_to_params(hf_dir: Path, config: ModelConfig) -> dict:
    """Map the saved safetensors (Hub or transformers-v5 names) onto the Flax params tree."""
    tensors = {}
    for file in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(file))
    params: dict = {}
    for name, value in tensors.items():
        name = name.replace("model.visual.", "visual.").replace("model.language_model.", "model.")
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        *path, last = [int(p) if p.isdigit() else p for p in name.split(".")]
        if path[-1] == "embed_tokens":
            key = "embedding"
        elif path == ["visual", "patch_embed", "proj"]:
            key, value = "kernel", value.reshape(value.shape[0], -1).T
        elif last == "weight" and value.ndim == 1:
            key = "scale"
        elif last == "weight":
            key, value = "kernel", value.T
        else:
            key = last
        node = params
        for p in path:
            node = node.setdefault(p, {})
        node[key] = np.ascontiguousarray(value)
    for group, stack in (("model", "layers"), ("visual", "blocks")):
        numbered = params[group][stack]
        params[group][stack] = jax.tree.map(lambda *layers: np.stack(layers), *(numbered[i] for i in sorted(numbered)))
    return params


def mm_token_types(input_ids: np.ndarray, config: ModelConfig) -> np.ndarray:
    return np.where(input_ids == config.image_token_id, 1, np.where(input_ids == config.video_token_id, 2, 0)).astype(
        np.int64
    )


def hf_logits(model, inputs: dict, config: ModelConfig, position_ids: np.ndarray | None = None) -> np.ndarray:
    """Reference logits; positions from transformers' own rope index unless given."""
    kwargs = {k: torch.as_tensor(np.asarray(v)) for k, v in inputs.items() if v is not None}
    kwargs["mm_token_type_ids"] = torch.as_tensor(mm_token_types(np.asarray(inputs["input_ids"]), config))
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids, dtype=np.int64))
    with torch.no_grad():
        return model(**kwargs).logits.float().numpy()
