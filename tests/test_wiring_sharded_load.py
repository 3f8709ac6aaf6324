"""`wiring.load_model` with shardings: HF tensors and a random init land on the given
shardings, with the values an unsharded load gives."""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pyvision_jax import wiring
from pyvision_jax.convert import save_hf
from tests.tiny_random_cpu import get_config


def test_random_init_and_hf_load_go_straight_to_their_shardings(tmp_path):
    config = get_config()
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1), ("fsdp",))
    target = NamedSharding(mesh, PartitionSpec())
    model, plain = wiring.load_model(config)
    shardings = jax.tree.map(lambda _: target, wiring.param_shapes(config, model))
    _, sharded = wiring.load_model(config, sharding=shardings)
    assert jax.tree.structure(sharded) == jax.tree.structure(plain)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
        assert a.sharding == target
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    save_hf(model, plain, tmp_path / "hf", progress=False)
    config.model.hf_dir = str(tmp_path / "hf")
    _, loaded = wiring.load_model(config, sharding=shardings)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(plain)):
        assert a.sharding == target
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
