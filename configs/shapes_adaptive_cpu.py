"""The adaptive shapes toy (data.shape_tasks "shapes_adaptive": half the tasks hard and a speck on
four easy images in ten) with the embedded default's recipe (configs/tiny_cpu.py) at KL 0.1.
There no input-independent policy is right on more than 3/4 of the tasks (the careful plan on
every task; the guess, "A", scores 2/3), while the untooled answer on the easy family and the
careful plan on the hard one are right on 0.95: the gain has to come from choosing the plan by
task family. The exact figures per family:
    python -m experiments.plan_accuracy --kinds shapes_adaptive

It starts from the adaptive toy's SFT stage (`packaged:shapes_adaptive_sft`,
configs/sft_shapes_adaptive.py: the same plan shares as the shapes SFT stage, each plan's first
thought worded by what the options differ in).
The KL term (`rl.kl_coef`) holds each plan near its SFT share times exp(reward / coef); at 0.3
the SFT model's likeliest plan (quick, right on under half of either family) kept about a third of
the easy rollouts and the careful plan about three quarters of the hard ones.
It trains 36 steps, evaluated every 12 with early stopping on the validation seed 777
(--steps 36 --eval-every 12). Selection on 777 (docs/figures/shapes_adaptive_selection_kl*.json):
validation 0.927 at KL 0.1 without the tool reward, 0.906 with it, 0.792-0.844 at KL 0.3. The run
without the tool reward was fixed first; on the test seed 4242 one of its three seeds stopped
calling tools, and this recipe, run there after that was read, passed on all three. Seed 5151 is
its confirmation, run after this file was committed (docs/learning.md#learning-when-to-use-tools):
the plans held by family, the gain's intervals over 48 tasks reached below 0. Its second
confirmation, registered here before its first evaluation, is seed 6161 with 192 tasks x k = 4
(validation unchanged, 48 x 4 on 777: --validation-per-kind 48
--config.eval.heldout_seed=6161 --config.eval.heldout_per_kind=192), this recipe unchanged. On it
all three training seeds passed both checks (docs/figures/shapes_adaptive_confirm_6161.json).
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

embedded_default = sibling("tiny_cpu").get_config


def get_config() -> ml_collections.ConfigDict:
    c = embedded_default()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    c.model.hf_dir = "packaged:shapes_adaptive_sft"
    c.rl.kl_coef = 0.1
    c.train.steps = 36
    return c
