"""The embedded default: GRPO from the packaged SFT checkpoint of the "small" model, on CPU,
synthetic tasks, in process.

The checkpoint (pyvision_jax/assets/small_sft, HF safetensors) comes from
configs/sft_tiny.py (README "The SFT stage"); it writes code, reads what it printed and
answers, imperfectly, so groups have reward variance from the first step. Runs a handful of
GRPO steps in a few minutes on 2 cores:
    python launch/train.py --config configs/tiny_cpu.py --workdir /tmp/pyvision_tiny
Override any field: --config.rl.group_size=4 --config.train.steps=2; a random-init start:
--config.model.hf_dir= --config.model.preset=tiny
"""
import ml_collections

from configs.base import get_config as base_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.model.preset = "small"
    c.model.hf_dir = "packaged:small_sft"
    c.model.tokenizer = "tiny"
    c.episode.max_new_tokens_per_turn = 384
    c.episode.max_total_tokens = 1024
    c.eval.max_new_tokens_per_turn = 384
    c.eval.max_total_tokens = 1024
    c.rollout.length_buckets = (512, 1024)
    c.train.length_buckets = (768, 1024)
    return c
