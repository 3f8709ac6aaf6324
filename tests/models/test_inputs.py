"""prepare_inputs: processor-style dicts are checked on the host with errors naming the key."""

import numpy as np
import pytest
import torch

from pyvision_jax.models import ModelConfig, prepare_inputs

CONFIG = ModelConfig.preset("tiny")
IDS = np.array([[1, 2009] + [2012] * 4 + [2010]])


def pixels(n):
    return np.zeros((n, CONFIG.vision.patch_dim), np.float32)


def test_torch_tensors_and_missing_optional_keys_are_accepted():
    inputs, deltas = prepare_inputs(
        CONFIG,
        {
            "input_ids": torch.as_tensor(IDS),
            "pixel_values": torch.zeros(16, 1176),
            "image_grid_thw": torch.tensor([[1, 4, 4]]),
        },
    )
    assert inputs.positions.shape == (3, 1, 7) and inputs.attention_mask.dtype == bool
    assert inputs.layout.num_slots == 64 and inputs.pixel_values.shape == (64, 1176)
    assert deltas.tolist() == [5 - 7]


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"input_ids": IDS}, "4 <\\|image_pad\\|> tokens but no pixel_values"),
        ({"input_ids": IDS, "pixel_values": pixels(16)}, "must be given together"),
        ({"input_ids": IDS, "pixel_values": pixels(15), "image_grid_thw": [[1, 4, 4]]}, "pixel_values.*\\(16, 1176\\)"),
        ({"input_ids": IDS, "pixel_values": pixels(32), "image_grid_thw": [[1, 4, 8]]}, "gives 8 merged image tokens"),
        ({"input_ids": IDS[0]}, "input_ids"),
        ({"input_ids": IDS, "attention_mask": np.ones((1, 3))}, "attention_mask"),
    ],
)
def test_inconsistent_inputs_are_reported(inputs, message):
    with pytest.raises(ValueError, match=message):
        prepare_inputs(CONFIG, inputs)
