"""Run in a subprocess with 8 host devices: sharded (fsdp 4 x tensor 2) vs 1-device logits.

Run as `XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.models.mesh_check`
(`tests/models/test_sharding.py` does): XLA reads the flag when JAX starts."""

import sys
import time

import jax
import numpy as np
from jax.sharding import AxisType, PartitionSpec

from pyvision_jax.models import ModelConfig, logits, param_shapes, params_sharding


def main() -> None:
    assert jax.device_count() == 8, f"needs 8 devices (XLA_FLAGS, see the docstring), got {jax.devices()}"
    config = ModelConfig.preset("tiny")
    start = time.perf_counter()
    rng = np.random.default_rng(3)
    params = jax.tree.map(
        lambda s: (rng.standard_normal(s.shape) / np.sqrt(s.shape[0])).astype(np.float32), param_shapes(config)
    )
    timings = {"init": time.perf_counter() - start}
    rng = np.random.default_rng(0)
    grids = np.array([[1, 8, 12], [1, 4, 4]])
    rows = [
        list(rng.integers(0, 2000, 3)) + [2009] + [2012] * 24 + [2010] + [7, 8],
        list(rng.integers(0, 2000, 6)) + [2009] + [2012] * 4 + [2010] + [9],
    ]
    width = max(map(len, rows))
    ids = np.array([[0] * (width - len(r)) + r for r in rows])
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    pixels = rng.standard_normal((int(np.prod(grids, -1).sum()), config.vision.patch_dim)).astype(np.float32)
    inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "image_grid_thw": grids}

    start = time.perf_counter()
    single = np.asarray(logits(config, jax.device_put(params, jax.devices()[0]), inputs))

    timings["single"] = time.perf_counter() - start
    mesh = jax.make_mesh((1, 4, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    shardings = params_sharding(config, mesh)
    sharded_params = jax.device_put(params, shardings)
    kernel = sharded_params["model"]["layers"]["mlp"]["gate_proj"]["kernel"]
    assert kernel.sharding.spec == PartitionSpec(None, "fsdp", "tensor"), kernel.sharding
    assert len(kernel.addressable_shards) == 8 and kernel.addressable_shards[0].data.shape == (2, 16, 64)
    sharded = logits(config, sharded_params, inputs)
    assert len(sharded.devices()) == 8
    diff = float(np.abs(np.asarray(sharded) - single)[mask.astype(bool)].max())
    scale = float(np.abs(single).max())
    print(f"max_abs_diff={diff} max_abs_logit={scale} times={timings}")
    assert scale > 0.1, scale
    # fsdp x tensor splits the matmul reductions (and the scanned layers are partitioned as
    # one body), so sums are reassociated: fp32 rounding, ~2e-5 relative to the logits.
    sys.exit(0 if diff <= 5e-5 * scale else 1)


if __name__ == "__main__":
    main()
