"""The embedded default's recipe (configs/tiny_cpu.py) on the adaptive shapes toy
(data.shape_tasks "shapes_adaptive": half the tasks hard and a speck on four easy images in ten).
There no input-independent policy is right on more than 3/4 of the tasks (the careful plan on
every task; the guess, "A", scores 2/3), while the untooled answer on the easy family and the
careful plan on the hard one are right on 0.95: the gain has to come from choosing the plan by
task family. The exact figures per family:
    python -m experiments.plan_accuracy --kinds shapes_adaptive

It starts from the adaptive toy's SFT stage (`packaged:shapes_adaptive_sft`,
configs/sft_shapes_adaptive.py: the same plan shares as the shapes SFT stage, each plan's first
thought worded by what the options differ in), and trains 48 steps, evaluated every 12 with early
stopping on the validation seed 777 (--steps 48 --eval-every 12). Fixed on 777 before any run on
the test seed 4242 (docs/learning.md#learning-when-to-use-tools, selection file
docs/figures/shapes_adaptive_worded_selection.json): from this start the recipe's validation
accuracy rose from 0.542 to 0.833 over 48 steps (48 tasks x k = 2, evaluated every 6), still
rising at the end; at most 5 of an evaluation's 96 rollouts ended in a code error.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    c.model.hf_dir = "packaged:shapes_adaptive_sft"
    c.train.steps = 48
    return c
