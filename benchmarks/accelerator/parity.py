"""(a) Parity: the shipped small SFT model's logits in bf16 compute against fp32 on the
device, and the fp32 logits against transformers where torch sees the same device.

The fp32 run uses the "highest" matmul precision (GPUs would otherwise multiply float32 in
TF32); torch runs with TF32 off too. Each row is text around one image, so the vision tower
and its window/full attention take part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks.accelerator.measure import relative_error
from benchmarks.accelerator.records import SectionLog
from benchmarks.accelerator.sizes import ParitySizes, SuiteSizes
from pyvision_jax.convert import load_hf
from pyvision_jax.models import ModelConfig, forward, prepare_inputs

try:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
except ImportError as missing:
    torch, TORCH_MISSING = None, str(missing)

SMALL_SFT = Path(__file__).resolve().parents[2] / "pyvision_jax" / "assets" / "small_sft"
BF16_TOLERANCE = 5e-2
"""Relative logits error bf16 compute may have (fp32 softmax, bf16 matmuls)."""
FP32_TOLERANCE = 1e-4
"""Relative logits error between two fp32 implementations."""


def parity_inputs(config: ModelConfig, sizes: ParitySizes, seed: int = 0) -> dict[str, np.ndarray]:
    """Processor-style inputs: each row text, one image of `sizes.image_grid`, text."""
    rng = np.random.default_rng(seed)
    t, h, w = sizes.image_grid
    image = [config.vision_start_token_id] + [config.image_token_id] * (t * h * w // config.vision.merge_unit)
    image += [config.vision_end_token_id]
    half = sizes.text_tokens // 2
    ids = [
        list(rng.integers(0, config.vision_start_token_id, half))
        + image
        + list(rng.integers(0, config.vision_start_token_id, sizes.text_tokens - half))
        for _ in range(sizes.rows)
    ]
    pixels = rng.standard_normal((sizes.rows * t * h * w, config.vision.patch_dim)).astype(np.float32)
    return {
        "input_ids": np.asarray(ids, np.int64),
        "attention_mask": np.ones((sizes.rows, len(ids[0])), np.int64),
        "pixel_values": pixels,
        "image_grid_thw": np.asarray([sizes.image_grid] * sizes.rows, np.int64),
    }


def compare(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    return {
        "relative_error": relative_error(actual, expected),
        "max_abs": float(np.abs(actual - expected).max()),
        "argmax_agreement": float(np.mean(actual.argmax(-1) == expected.argmax(-1))),
    }


def torch_device() -> tuple[Any, str | None]:
    """(torch device on the JAX backend's kind of device, None) or (None, why not)."""
    if torch is None:
        return None, f"torch/transformers not importable ({TORCH_MISSING})"
    backend = jax.default_backend()
    if backend == "gpu" and torch.cuda.is_available():
        return torch.device("cuda"), None
    if backend == "cpu":
        return torch.device("cpu"), None
    return None, f"torch does not see this {backend} device"


def transformers_logits(
    inputs: dict[str, np.ndarray], positions: np.ndarray, config: ModelConfig, device: Any
) -> np.ndarray:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = (
        Qwen2_5_VLForConditionalGeneration.from_pretrained(SMALL_SFT, dtype=torch.float32, attn_implementation="eager")
        .to(device)
        .eval()
    )
    kwargs = {key: torch.as_tensor(value).to(device) for key, value in inputs.items()}
    kwargs["position_ids"] = torch.as_tensor(positions.astype(np.int64)).to(device)
    ids = inputs["input_ids"]
    token_types = np.where(ids == config.image_token_id, 1, np.where(ids == config.video_token_id, 2, 0))
    with torch.no_grad():
        try:
            out = model(**kwargs, mm_token_type_ids=torch.as_tensor(token_types).to(device))
        except TypeError:  # transformers releases that take no mm_token_type_ids
            out = model(**kwargs)
    return out.logits.float().cpu().numpy()


def run(sizes: SuiteSizes, log: SectionLog) -> None:
    config, params = load_hf(SMALL_SFT, dtype="float32", progress=False)
    inputs = parity_inputs(config, sizes.parity)
    model_inputs, _ = prepare_inputs(config, inputs)
    with jax.default_matmul_precision("highest"):
        reference = np.asarray(forward(config, "float32", params, model_inputs)[0])
    bf16 = np.asarray(forward(config, "bfloat16", params, model_inputs)[0])
    shape = f"{sizes.parity.rows} rows x {inputs['input_ids'].shape[1]} tokens, image grid {sizes.parity.image_grid}"
    result = compare(bf16, reference) | {"tolerance": BF16_TOLERANCE, "logits_abs_max": float(np.abs(reference).max())}
    result["ok"] = result["relative_error"] < BF16_TOLERANCE
    log.record(
        "bf16 vs fp32",
        result,
        f"{shape}: rel err {result['relative_error']:.2e}, max abs "
        f"{result['max_abs']:.3f}, argmax agree {result['argmax_agreement']:.3f} (ok: {result['ok']})",
    )
    device, reason = torch_device()
    if device is None:
        log.record("fp32 vs transformers", {"skipped": reason}, f"skipped: {reason}")
        return
    expected = transformers_logits(inputs, np.asarray(model_inputs.positions), config, device)
    result = compare(reference, expected) | {"tolerance": FP32_TOLERANCE, "torch_device": str(device)}
    result["ok"] = result["relative_error"] < FP32_TOLERANCE
    log.record(
        "fp32 vs transformers",
        result,
        f"torch on {device}: rel err {result['relative_error']:.2e}, "
        f"max abs {result['max_abs']:.2e}, argmax agree {result['argmax_agreement']:.3f} (ok: {result['ok']})",
    )
