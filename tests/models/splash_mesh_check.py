"""Run in a subprocess with 4 host devices: splash attention (Pallas interpret mode) under a
data x fsdp mesh, rows sharded, equals the dense reference; the kernel runs per shard (no
all-gather of the inputs).

Run as `XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m tests.models.splash_mesh_check`
(`tests/models/test_attention.py` does): XLA reads the flag when JAX starts."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from pyvision_jax.models.attention import AttentionConfig, attention


def main() -> None:
    assert jax.device_count() == 4, f"needs 4 devices (XLA_FLAGS, see the docstring), got {jax.devices()}"
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 150, n, 16)).astype(np.float32) for n in (4, 2, 2))
    segments = np.stack(
        [
            np.repeat([1, 2, 0], [60, 70, 20]),
            np.repeat([3, 0], [150, 0]),
            np.repeat([0, 4], [10, 140]),
            np.zeros(150, int),
        ]
    ).astype(np.int32)

    def loss_and_grads(config):
        loss = lambda q, k, v, s: jnp.sum(attention(q, k, v, s, s, causal=True, scale=0.25, config=config) ** 2)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    expected = loss_and_grads(AttentionConfig("dense"))(q, k, v, segments)
    mesh = jax.make_mesh((2, 2, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    rows = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
    with jax.set_mesh(mesh):
        step = loss_and_grads(AttentionConfig("splash", 128, 128))
        args = [rows(x) for x in (q, k, v, segments)]
        hlo = step.lower(*args).compile().as_text()
        got = step(*args)
    assert "all-gather" not in hlo
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)
    print("OK splash sharded")


if __name__ == "__main__":
    main()
