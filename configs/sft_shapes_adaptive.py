"""SFT of the "small" model for the adaptive shapes toy (the packaged checkpoint
`packaged:shapes_adaptive_sft`, docs/learning.md#learning-when-to-use-tools):
    python launch/train.py --config configs/sft_shapes_adaptive.py --workdir /tmp/sft_adaptive \\
        --config.sft.export_dir=pyvision_jax/assets/shapes_adaptive_sft

The shapes SFT stage (configs/sft_shapes.py: the same plan shares, task count, seed and steps) on
tasks of the adaptive kind, each plan's first thought worded by what the options differ in
(`sft.wording_by_options`, data.shape_plans). The plan is drawn apart from the wording, so the SFT
data holds each plan in the same share on every task.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

sft_shapes = sibling("sft_shapes").get_config


def get_config() -> ml_collections.ConfigDict:
    c = sft_shapes()
    c.data.synthetic_kinds = ("shapes_adaptive",)
    c.sft.wording_by_options = True
    return c
