"""The embedded default's recipe (configs/tiny_cpu.py) on the direct-answer shapes toy
(data.shape_tasks "shapes_direct": one task in four hard and a speck on three easy images in
ten, so that an untooled guess is right more often than the tools, 0.833 against 0.750 over
the generator's tasks (`python -m experiments.plan_accuracy`), while the tools are still the
best plan on the hard tasks). The longer tool-reward ablation
of docs/learning.md runs on it:
    python -m experiments.reproduce_dynamics --config configs/shapes_direct_cpu.py \
        --workdir /tmp/direct --steps 24 --eval-every 12 --variants full,no_tool_reward
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_direct",)
    return c
