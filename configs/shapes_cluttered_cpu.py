"""The embedded default's recipe (configs/tiny_cpu.py) on the cluttered shapes toy
(data.shape_tasks "shapes_cluttered": a speck on one easy image in ten makes measuring answer
wrong, so the tools cost accuracy where an untooled guess is always right). The tool-reward
ablation on it (docs/figures/shapes_cluttered_learning.json, quoted in docs/learning.md):
    python -m experiments.reproduce_dynamics --config configs/shapes_cluttered_cpu.py \
        --workdir /tmp/cluttered --steps 12 --eval-every 12 --seeds 0,1 --variants full,no_tool_reward \
        --config.eval.heldout_per_kind=48 --config.eval.heldout_k=4
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_cluttered",)
    return c
