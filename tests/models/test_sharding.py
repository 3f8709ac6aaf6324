"""Logical-axis sharding: every parameter is annotated; an 8-device mesh gives 1-device logits."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from pyvision_jax.models import ModelConfig, param_logical_axes, param_shapes
from pyvision_jax.models.sharding import LOGICAL_AXIS_RULES, mesh_partition_spec

REPO = Path(__file__).resolve().parents[2]


def test_every_parameter_has_one_known_logical_axis_per_dimension():
    config = ModelConfig.preset("tiny")
    axes, shapes = param_logical_axes(config), param_shapes(config)
    known = {name for name, _ in LOGICAL_AXIS_RULES}
    pairs = jax.tree.leaves(
        jax.tree.map(lambda a, s: (a, s.shape), axes, shapes, is_leaf=lambda x: isinstance(x, tuple)),
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], tuple),
    )
    assert len(pairs) == len(jax.tree.leaves(shapes))
    for names, shape in pairs:
        assert len(names) == len(shape) and all(n in known for n in names), (names, shape)


def test_stacked_layers_lead_with_the_replicated_layers_axis():
    config = ModelConfig.preset("tiny")
    axes, shapes = param_logical_axes(config), param_shapes(config)
    q_proj = axes["model"]["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q_proj == ("layers", "embed", "heads")
    assert shapes["model"]["layers"]["self_attn"]["q_proj"]["kernel"].shape[0] == config.num_hidden_layers
    assert axes["visual"]["blocks"]["attn"]["qkv"]["kernel"] == ("layers", "vit_embed", "vit_qkv")
    assert axes["model"]["norm"]["scale"] == ("norm",)
    fake_mesh = type("FakeMesh", (), {"shape": {"data": 1, "fsdp": 2, "tensor": 1}})()
    assert tuple(mesh_partition_spec(q_proj, (2, 64, 64), fake_mesh)) == (None, "fsdp", "tensor")


def test_mesh_axes_that_do_not_divide_are_dropped():
    mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"))
    spec = mesh_partition_spec(("embed", "kv_heads"), (64, 3), mesh)
    assert tuple(spec) == ("fsdp", "tensor")
    fake_mesh = type("FakeMesh", (), {"shape": {"data": 1, "fsdp": 4, "tensor": 2}})()
    assert tuple(mesh_partition_spec(("embed", "kv_heads"), (64, 3), fake_mesh)) == ("fsdp", None)
    assert tuple(mesh_partition_spec(("batch", None), (8, 5), fake_mesh)) == (("data", "fsdp"), None)


def test_eight_device_mesh_matches_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "tests.models.mesh_check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "max_abs_diff=" in result.stdout
    assert np.isfinite(float(result.stdout.split("max_abs_diff=")[1].split()[0]))
