"""SFT of the "small" model on synthetic tool-use trajectories (the shipped checkpoint).

Scripted solutions of the synthetic tasks run through the real episode code and sandbox,
then 1,200 steps of next-token loss on the assistant tokens, then an HF safetensors
export. The packaged checkpoint is made with (docs/learning.md, "The four-kind toy"):
    python launch/train.py --config configs/sft_tiny.py --workdir /tmp/sft_tiny \
        --config.sft.export_dir=pyvision_jax/assets/small_sft
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

base_config = sibling("base").get_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.algorithm = "sft"
    c.model.preset = "small"
    c.model.tokenizer = "tiny"
    c.episode.max_new_tokens_per_turn = 384
    c.episode.max_total_tokens = 1024
    c.sft.synthetic_per_kind = 80
    c.sft.rollouts_per_task = 2
    c.sft.batch_size = 8
    c.train.steps = 1200
    c.train.lr = 3e-3
    c.train.weight_decay = 0.0
    c.train.schedule = "cosine"
    c.train.warmup_steps = 20
    c.train.micro_batch = 8
    c.train.length_buckets = (768, 1024)
    c.train.checkpoint_every = 200
    return c
