"""The embedded default: a tiny random-init Qwen2.5-VL on CPU, synthetic tasks, in process.

Runs a handful of GRPO steps in a few minutes on 2 cores:
    python launch/train.py --config configs/tiny_cpu.py --workdir /tmp/pyvision_tiny
Override any field: --config.rl.group_size=4 --config.train.steps=2. GRPO from the packaged
SFT checkpoint of the "small" model (configs/sft_tiny.py, README "The SFT stage"):
--config.model.preset=small --config.model.hf_dir=packaged:small_sft
"""
import ml_collections

from configs.base import get_config as base_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.model.preset = "tiny"
    c.model.tokenizer = "tiny"
    return c
