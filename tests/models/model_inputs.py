"""Token ids and patches of text, image and video inputs for the model tests."""

import numpy as np

V_START, V_END, IMAGE, VIDEO = 2009, 2010, 2012, 2013


def image_tokens(grid, merge=2):
    t, h, w = grid
    return [V_START] + [IMAGE] * (t * h * w // merge**2) + [V_END]


def video_tokens(grid, merge=2):
    t, h, w = grid
    return [V_START] + [VIDEO] * (t * h * w // merge**2) + [V_END]


def patches(config, grids, seed):
    n = sum(int(np.prod(g)) for g in grids)
    return np.random.default_rng(seed).standard_normal((n, config.vision.patch_dim)).astype(np.float32)


def text(n, seed):
    return list(np.random.default_rng(seed).integers(0, 2000, n))


# Single-row vision cases share one compiled shape: 48 tokens (right-padded), 4 windows,
# 32 merged-token slots. That also checks that right padding leaves real logits unchanged.
SHARED_LENGTH = 48


def right_padded(ids, length=SHARED_LENGTH, pad=2000):
    assert len(ids) <= length
    return np.array([ids + [pad] * (length - len(ids))]), np.array([[1] * len(ids) + [0] * (length - len(ids))])
