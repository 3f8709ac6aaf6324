"""Run in a subprocess with 8 host devices: the loss and gradients of the train step on a
fsdp=4 x tensor=2 mesh equal those on one device. Prints SHARDED-OK on success.

Run as `XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.train.sharded_step_check`
(`tests/train/test_sharded_step.py` does): XLA reads the flag when JAX starts."""

import dataclasses

import jax
import numpy as np

from pyvision_jax.models import ModelConfig, init_params, param_logical_axes
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, pack_batch
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, loss_and_grads
from tests.train.trajectories import make_trajectory


def main() -> None:
    assert len(jax.devices()) == 8, f"needs 8 devices (XLA_FLAGS, see the docstring), got {jax.devices()}"
    base = ModelConfig.preset("tiny")
    config = dataclasses.replace(
        base, num_hidden_layers=1, vision=dataclasses.replace(base.vision, depth=2, fullatt_block_indexes=(1,))
    )
    params = init_params(config, seed=0)
    rows = [
        make_trajectory(config, seed, prompt=8 + 3 * seed, generated=10 + 4 * seed, images=1 + seed % 2)
        for seed in range(4)
    ]
    host, _ = pack_batch(config, rows, [0.7, -0.4, 1.1, -0.9], BatchingConfig((64,), 4))
    step_config = StepConfig(temperature=0.7, logprob_chunk=16, old_logprobs="behaviour")
    optimizer = make_optimizer(OptimizerConfig())
    results = {}
    for name, mesh in (("one", make_mesh(1, 1, 1, devices=jax.devices()[:1])), ("fsdp4xtp2", make_mesh(1, 4, 2))):
        state = init_train_state(params, optimizer, 0)
        shardings = state_shardings(state, param_logical_axes(config), mesh)
        state = jax.device_put(state, shardings)
        batch = shard_batch(host, mesh)
        fn = jax.jit(loss_and_grads, static_argnums=(0, 1))
        results[name] = jax.device_get(fn(config, step_config, state.params, batch))
        if name == "fsdp4xtp2":
            spec = state.params["lm_head"]["kernel"].sharding.spec
            assert tuple(spec) == ("fsdp", "tensor"), spec
            assert batch.input_ids.sharding.spec[1] == ("data", "fsdp") or batch.input_ids.sharding.spec[1] == "fsdp"
    one, sharded = results["one"], results["fsdp4xtp2"]
    np.testing.assert_allclose(sharded[0], one[0], rtol=1e-5)
    assert float(sharded[2]) == float(one[2])
    for a, b in zip(jax.tree.leaves(sharded[1]), jax.tree.leaves(one[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    print("SHARDED-OK", float(one[0]))


if __name__ == "__main__":
    main()
