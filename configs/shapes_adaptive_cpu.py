"""The embedded default's recipe (configs/tiny_cpu.py) on the adaptive shapes toy
(data.shape_tasks "shapes_adaptive": half the tasks hard and a speck on four easy images in ten).
There no input-independent policy is right on more than 3/4 of the tasks (the careful plan on
every task; the guess, "A", scores 2/3), while the untooled answer on the easy family and the
careful plan on the hard one are right on 0.95: the gain has to come from choosing the plan by
task family. The exact figures per family:
    python -m experiments.plan_accuracy --kinds shapes_adaptive
It holds the embedded default's recipe unchanged.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    return c
