"""The embedded default's recipe (configs/tiny_cpu.py) on the adaptive shapes toy
(data.shape_tasks "shapes_adaptive": half the tasks hard and a speck on four easy images in ten).
There no input-independent policy is right on more than 3/4 of the tasks (the careful plan on
every task; the guess, "A", scores 2/3), while the untooled answer on the easy family and the
careful plan on the hard one are right on 0.95: the gain has to come from choosing the plan by
task family. The exact figures per family:
    python -m experiments.plan_accuracy --kinds shapes_adaptive

It starts from the adaptive toy's SFT stage (`packaged:shapes_adaptive_sft`,
configs/sft_shapes_adaptive.py: the same plan shares as the shapes SFT stage, each plan's first
thought worded by what the options differ in). Two fields differ from the embedded default:
- `rl.kl_coef` 0.1: the KL term holds each plan near its SFT share times exp(reward / coef). At 0.3
  the SFT model's likeliest plan (quick, right on under half of either family) kept about a third
  of the easy rollouts and the careful plan about three quarters of the hard ones.
- `rl.tool_reward_coef` 0: on the easy tasks without a speck the careful plan is as right as the
  untooled answer, so a bonus per tool call on right answers pays the tools where they do not help.
It trains 36 steps, evaluated every 12 with early stopping on the validation seed 777
(--steps 36 --eval-every 12). Fixed on 777 before any run on the test seed 4242
(docs/learning.md#learning-when-to-use-tools; selection files
docs/figures/shapes_adaptive_selection_kl*.json): validation 0.927 at steps 24 and 42 of 48 at KL 0.1
without the tool reward, against 0.906 with it and 0.792-0.844 at KL 0.3.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    c.model.hf_dir = "packaged:shapes_adaptive_sft"
    c.rl.kl_coef = 0.1
    c.rl.tool_reward_coef = 0.0
    c.train.steps = 36
    return c
