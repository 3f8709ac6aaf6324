"""The four-kind toy: GRPO on CPU from the packaged SFT checkpoint of the "small" model on the
visual-search, counting and video tasks (configs/sft_tiny.py, docs/learning.md "The four-kind
toy"), the JAX engine in process. The throughput, stopping and fleet benchmarks run on it.

    python launch/train.py --config configs/kinds_cpu.py --workdir /tmp/pyvision_kinds
Its SFT policy's likeliest behaviour is already its best, so RL here only sharpens: the config
trains the temperature alone. A random-init tiny model instead: --config.model.preset=tiny
--config.model.hf_dir= (nothing to learn from: every group has zero reward variance).
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

base_config = sibling("base").get_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.model.preset = "small"
    c.model.hf_dir = "packaged:small_sft"
    c.model.tokenizer = "tiny"
    c.episode.max_new_tokens_per_turn = 384
    c.episode.max_total_tokens = 1024
    c.episode.max_concurrent = 32
    c.rollout.max_batch = 32
    c.sandbox.pool_size = 4
    c.rollout.length_buckets = (512, 1024)
    c.train.length_buckets = (1024,)
    # Only the temperature is trained: the final norm's scale, every entry moved by one shared
    # amount (its entries are nearly equal after SFT, so this divides every logit by one number),
    # and every other update multiplied by 0. Sharpening is the one update that carries over to new
    # tasks at this scale (docs/learning.md); the whole model at any step size either
    # does not move (1e-4) or drifts off its own samples (3e-4 and up), and the norm's scale
    # trained entry by entry reshapes the logits instead of sharpening them.
    c.train.lr = 1.0
    c.train.lr_multipliers = ("model/norm/scale=1", ".*=0")
    c.train.uniform_updates = ("model/norm/scale",)
    c.rl.batch_groups = 4
    c.eval.max_new_tokens_per_turn = 384
    c.eval.heldout_per_kind = 8
    c.eval.heldout_k = 2
    return c
