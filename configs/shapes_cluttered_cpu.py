"""The embedded default's recipe (configs/tiny_cpu.py) on the cluttered shapes toy
(data.shape_tasks "shapes_cluttered": a speck on one easy image in ten makes measuring answer
wrong, so the tools cost accuracy where an untooled guess is always right). The tool-reward
ablation of docs/learning.md runs on it:
    python -m experiments.reproduce_dynamics --config configs/shapes_cluttered_cpu.py \
        --workdir /tmp/cluttered --steps 12 --eval-every 12 --variants full,no_tool_reward
"""

import ml_collections

from configs.tiny_cpu import get_config as embedded_default


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_cluttered",)
    return c
