"""The embedded default: GRPO of the whole language model on CPU, on the shapes toy (a task
where the SFT policy's likeliest plan is not its best one, docs/learning.md), from the packaged
SFT checkpoint of the "small" model (configs/sft_shapes.py), the JAX engine in process.

The recipe with held-out accuracy before and after, in about two minutes on 2 cores:
    python launch/train.py --config configs/tiny_cpu.py --workdir /tmp/pyvision_tiny
Override any field: --config.rl.group_size=8 --config.train.steps=20. The vision tower stays
frozen (train.freeze_vision); every other weight trains, with a KL term to the SFT model.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

shapes = sibling("shapes")
base_config = sibling("base").get_config


def get_config() -> ml_collections.ConfigDict:
    c = shapes.apply(base_config())
    c.model.hf_dir = "packaged:shapes_sft"
    # a step's 64 episodes at once, each holding its own engine slot between turns (KV
    # continuation): new episodes prefill together in one dispatch instead of joining a few at a
    # time as others end (docs/performance.md#the-main-jobs-wall-time)
    c.episode.max_concurrent = 64
    c.rollout.max_batch = 64
    # every engine dispatch at 64 rows: one prefill, extension and decode executable per length
    # rather than one per row count; on 2 cores an executable takes 1.5-3.5 s to compile, more
    # than the padded rows cost
    c.rollout.batch_sizes = (64,)
    # one trajectory per row: a step's 32 trajectories fill 4 micro-batches of 8 whatever their
    # lengths, so the train step compiles once (packed, the micro-batch count grows 3 -> 4 in step
    # 2 and the step compiles again, 7-10 s here)
    c.train.pack = False
    # vision sizes with room for two images per row from step 1 (the task's image and a crop): a
    # step's 40-55 images fit, so the train step does not compile again when a batch holds more
    c.train.images_per_row = 2
    # LLVM level 1: the run's executables compile faster and the small model's steps run as fast
    # (docs/performance.md#the-main-jobs-wall-time)
    c.train.xla_backend_optimization_level = 1
    c.sandbox.pool_size = 8
    c.data.synthetic_per_kind = 64  # training tasks (seed 0): a step draws 16 of them
    c.rl.batch_groups = 8
    c.rl.group_size = 4
    # A small model's optimizer (chosen on the validation seed 777, docs/learning.md): an epsilon
    # above the typical gradient entry (~4e-5), so an entry moves in proportion to its gradient
    # rather than by about lr whatever its size (1e-8 moves every weight, sampled or not); a second
    # moment that forgets in ~100 steps; a short warmup while it fills.
    c.train.lr = 1e-3
    c.train.b2 = 0.99
    c.train.eps = 1e-4
    c.train.warmup_steps = 2
    c.train.weight_decay = 0.0
    # A KL term to the SFT model (chosen on 777, docs/learning.md): the recipe has none, but at a step
    # size that moves this small model's plans in 12 steps, noise alone (the random-reward control)
    # wrecks the policy without it, and the tool reward's push on correct guesses splices plans into
    # malformed code.
    c.rl.kl_coef = 0.3
    c.train.steps = 12
    c.train.micro_batch = 8
    c.eval.heldout_per_kind = 24
    c.eval.heldout_k = 2
    return c
