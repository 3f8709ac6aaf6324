"""Prefill time of the Flax Qwen2.5-VL vs transformers (torch) on the same small config, CPU.

One 448x448 image (1024 patches, 256 merged tokens) plus 256 text tokens through a model
with hidden 512, 8 decoder layers and a ViT of depth 8. Both run on the same random weights;
the script prints the median of several timed repeats after warm-up (the two alternate, so
both see the same load) and the ratio flax/torch (target <= 1.0).

    .venv/bin/python -m benchmarks.model_forward [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from pyvision_jax.convert import load_hf
from pyvision_jax.convert.hf_config import hf_config_dict
from pyvision_jax.models import ModelConfig, VisionConfig, forward, logits, prepare_inputs

IMAGE_SIDE, TEXT_TOKENS = 448, 256


def bench_config() -> ModelConfig:
    return ModelConfig.preset("tiny").replace(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        mrope_section=(8, 12, 12),
        vision=VisionConfig(
            depth=8,
            hidden_size=256,
            intermediate_size=640,
            num_heads=4,
            out_hidden_size=512,
            fullatt_block_indexes=(3, 7),
            window_size=112,
        ),
    )


def make_inputs(config: ModelConfig) -> dict:
    rng = np.random.default_rng(0)
    grid = (1, IMAGE_SIDE // 14, IMAGE_SIDE // 14)
    n_image = grid[1] * grid[2] // 4
    half = TEXT_TOKENS // 2
    ids = (
        list(rng.integers(0, 2000, half))
        + [config.vision_start_token_id]
        + [config.image_token_id] * n_image
        + [config.vision_end_token_id]
        + list(rng.integers(0, 2000, TEXT_TOKENS - half))
    )
    pixels = rng.standard_normal((grid[1] * grid[2], config.vision.patch_dim)).astype(np.float32)
    return {
        "input_ids": np.array([ids]),
        "attention_mask": np.ones((1, len(ids)), np.int64),
        "pixel_values": pixels,
        "image_grid_thw": np.array([grid]),
    }


def timed_interleaved(fns: list, repeats: int) -> list[float]:
    """Median seconds of each fn; runs alternate so both see the same machine load."""
    for fn in fns:  # warm-up (compilation for JAX)
        fn()
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    config = bench_config()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**hf_config_dict(config)))
        model.save_pretrained(tmp)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(Path(tmp), dtype=torch.float32).eval()
        params = jax.device_put(load_hf(tmp, dtype="float32", progress=False)[1])  # the project's converter
    inputs = make_inputs(config)
    seq_len = inputs["input_ids"].shape[1]

    model_inputs, _ = prepare_inputs(config, inputs)
    position_ids = torch.as_tensor(np.array(model_inputs.positions), dtype=torch.long)
    torch_inputs = {k: torch.as_tensor(v) for k, v in inputs.items()}

    def run_flax():  # end to end: host-side positions and vision layout included
        logits(config, params, inputs).block_until_ready()

    def run_torch():
        with torch.inference_mode():
            model(**torch_inputs, position_ids=position_ids)

    flax_s, torch_s = timed_interleaved([run_flax, run_torch], args.repeats)
    # same weights, same positions: the two must agree before their times mean anything
    with torch.inference_mode():
        reference = model(**torch_inputs, position_ids=position_ids).logits.numpy()
    diff = float(np.abs(np.asarray(forward(config, "float32", params, model_inputs)[0]) - reference).max())

    print(
        f"config: hidden {config.hidden_size}, {config.num_hidden_layers} layers, ViT depth "
        f"{config.vision.depth}; one {IMAGE_SIDE}x{IMAGE_SIDE} image + {TEXT_TOKENS} text tokens "
        f"({seq_len} tokens); torch threads {torch.get_num_threads()}, attn {model.config._attn_implementation}"
    )
    print(f"max |logits diff| flax vs torch: {diff:.2e}")
    print(f"flax prefill  (median of {args.repeats}): {flax_s * 1e3:8.1f} ms")
    print(f"torch prefill (median of {args.repeats}): {torch_s * 1e3:8.1f} ms")
    print(f"ratio flax/torch: {flax_s / torch_s:.3f}  (target <= 1.0, aim 0.8)")


if __name__ == "__main__":
    main()
