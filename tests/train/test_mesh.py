"""The trainer's mesh: sizes, the ICI/DCN split of a multi-process mesh, and distributed
initialisation that runs first and reports its own error."""

import jax
import pytest

from pyvision_jax.train.mesh import make_mesh, resolve_mesh_shape, split_over_processes
from pyvision_jax.wiring import build_trainer
from tests.tiny_random_cpu import get_config


def test_one_free_axis_takes_the_remaining_devices():
    assert resolve_mesh_shape(2, -1, 1, 8) == (2, 4, 1)
    with pytest.raises(ValueError, match="multiply to 4"):
        resolve_mesh_shape(2, 2, 1, 8)


def test_processes_split_data_first_then_fsdp_and_keep_the_rest_within_a_host():
    assert split_over_processes((4, 2, 1), 2) == ((2, 2, 1), (2, 1, 1))
    assert split_over_processes((1, 8, 2), 4) == ((1, 2, 2), (1, 4, 1))
    assert split_over_processes((2, 4, 2), 4) == ((1, 2, 2), (2, 2, 1))
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        split_over_processes((1, 4, 1), 3)


def test_one_process_mesh_is_the_devices_in_order():
    devices = jax.devices()[:1]
    mesh = make_mesh(1, -1, 1, devices=devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert list(mesh.devices.flat) == devices


def test_config_has_the_distributed_keys_with_autodetect_defaults():
    train = get_config().train
    assert (train.distributed, train.coordinator_address, train.num_processes, train.process_id) == (False, "", 0, -1)


def test_distributed_init_after_jax_started_fails_with_its_own_error(tmp_path):
    jax.devices()  # this test process has used JAX already: initialize must refuse
    config = get_config()
    config.train.distributed = True
    config.train.coordinator_address = "127.0.0.1:1"
    config.train.num_processes, config.train.process_id = 2, 1
    lines = []
    with pytest.raises(RuntimeError, match="before any JAX"):
        build_trainer(config, tmp_path, progress=False, log=lines.append).run()
    assert not any("while closing" in line for line in lines), lines
    assert not (tmp_path / "checkpoints").exists()  # it failed first, before touching the workdir
