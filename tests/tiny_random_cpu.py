"""A config file for tests: the tiny random-init model on CPU (the embedded default before it
started from the packaged SFT checkpoint). Seconds per step; nothing to learn."""

import ml_collections

from configs.base import get_config as base_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.model.preset = "tiny"
    c.model.tokenizer = "tiny"
    return c
