"""SFT of the "small" model on scripted plans of the shapes toy (the packaged checkpoint
`packaged:shapes_sft`, docs/learning.md "The starting checkpoint"):
    python launch/train.py --config configs/sft_shapes.py --workdir /tmp/sft_shapes \
        --config.sft.export_dir=pyvision_jax/assets/shapes_sft

Plans (data.shape_plans): 60 % quick (one call: a guessed letter, right on 4/9 of easy and 1/3
of hard tasks), 25 % careful (look, then measure: right on every easy task and 9 in 10 hard ones),
15 % an untooled guess of "A" (right on the easy family and on a third of hard tasks; exact
figures: `python -m experiments.plan_accuracy --kinds shapes`), on 400
tasks of seed 1000, two draws each; 450 steps of 16 samples.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

shapes = sibling("shapes")
base_config = sibling("base").get_config


def get_config() -> ml_collections.ConfigDict:
    c = shapes.apply(base_config())
    c.algorithm = "sft"
    c.sft.synthetic_per_kind = 400
    c.sft.rollouts_per_task = 2
    c.sft.guess_share = 0.15
    c.sft.careful_share = 0.25
    c.sft.wrong_share = 0.0
    c.sft.batch_size = 16
    c.train.steps = 450
    c.train.lr = 3e-3
    c.train.weight_decay = 0.0
    c.train.schedule = "cosine"
    c.train.warmup_steps = 20
    c.train.micro_batch = 16
    c.train.checkpoint_every = 100
    c.sandbox.pool_size = 4
    return c
