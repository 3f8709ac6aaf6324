"""The embedded default's recipe (configs/tiny_cpu.py) on the adaptive shapes toy
(data.shape_tasks "shapes_adaptive": half the tasks hard and a speck on four easy images in ten).
There no input-independent policy is right on more than 3/4 of the tasks (the careful plan on
every task; the guess, "A", scores 2/3), while the untooled answer on the easy family and the
careful plan on the hard one are right on 0.95: the gain has to come from choosing the plan by
task family. The exact figures per family:
    python -m experiments.plan_accuracy --kinds shapes_adaptive

The recipe (fixed on the validation seed 777 before any run on the test seed 4242,
docs/learning.md#learning-when-to-use-tools): the embedded default's (lr 1e-3, KL 0.3, B 8, G 4)
unchanged, trained 6 steps (--steps 6), evaluated on 48 tasks x k = 4
(--config.eval.heldout_per_kind=48 --config.eval.heldout_k=4). Tried on 777 (48 tasks x k = 2,
seed 778 in the held-out slot, docs/figures/shapes_adaptive_selection.json): this recipe scored
0.583 at the start, 0.604 at step 6 and 0.448 at step 12 (22 of 96 rollouts ending in malformed
code), so 6 steps; the same to 20 steps and KL 0.1 to 12 steps were stopped before any evaluation.
No setting tried reaches the best input-independent policy on 777 (the careful plan, 0.708).
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    return c
