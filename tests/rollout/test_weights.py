"""Weight publishing: versioned atomic HF directories, announcement, pruning, safe readers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.queue import LocalTrajectoryQueue
from pyvision_jax.rollout.vllm_engine import hf_tensors
from pyvision_jax.rollout.weights import loading
from pyvision_jax.rollout.weights import publisher as publisher_module
from pyvision_jax.rollout.weights.in_process import WeightsInbox, update_engines
from pyvision_jax.rollout.weights.loading import load_latest, load_weights, open_hf_tensors
from pyvision_jax.rollout.weights.publisher import WeightsPublisher
from pyvision_jax.rollout.weights.version_dirs import (
    COMPLETE_MARKER,
    FROZEN_FILE,
    TRAINABLE_FILE,
    IncompleteWeightsError,
    check_complete,
    complete_versions,
    latest_complete,
)
from pyvision_jax.rollout.weights.watchers import HfTensorsWatcher, WeightsWatcher

ROOT = Path(__file__).resolve().parents[2]
BF16 = np.dtype(jnp.bfloat16)


@pytest.fixture(scope="module")
def model_config():
    return ModelConfig.preset("tiny")


@pytest.fixture(scope="module")
def shapes(model_config):
    return jax.eval_shape(lambda: init_params(model_config))


def filled(shapes, version: int):
    """Params whose every element is `version`: a partial mix of versions would show."""
    return jax.tree.map(lambda s: np.full(s.shape, version, np.float32), shapes)


def versions_in(params) -> set[float]:
    return {float(v) for leaf in jax.tree.leaves(params) for v in np.unique(np.asarray(leaf))}


class RecordingEngine:
    def __init__(self, version=0):
        self.version = version
        self.updates = []

    def update_weights(self, weights, version):
        self.updates.append((weights, version))
        self.version = version


def test_in_process_update_hands_the_pytree_to_every_engine(shapes):
    engines = [RecordingEngine(), RecordingEngine()]
    params = filled(shapes, 4)
    update_engines(engines, params, 4)
    assert all(e.updates == [(params, 4)] and e.version == 4 for e in engines)


def test_publish_announces_loads_and_prunes(tmp_path, model_config, shapes):
    queue = LocalTrajectoryQueue()
    publisher = WeightsPublisher(tmp_path, model_config, queue=queue, keep=2)
    for version in (1, 2, 3):
        path = publisher.publish(version, filled(shapes, version))
        assert path.name == f"v{version:06d}"
    assert [v.version for v in complete_versions(tmp_path)] == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]
    announced = queue.latest_weights()
    assert (announced.version, announced.location) == (3, str(tmp_path / "v000003"))
    version, config, params = load_weights(announced.location)
    assert version == 3 and config == model_config and versions_in(params) == {3.0}
    assert jax.tree.structure(params) == jax.tree.structure(shapes)


def test_watcher_loads_announced_complete_versions_only(tmp_path, model_config, shapes):
    queue = LocalTrajectoryQueue()
    engine = RecordingEngine()
    watcher = WeightsWatcher(queue, engine)
    assert watcher.poll() is None
    queue.publish_weights(5, str(tmp_path / "v000005"))  # announced, never written
    assert watcher.poll() is None and engine.updates == []
    WeightsPublisher(tmp_path, model_config, queue=queue).publish(6, filled(shapes, 6))
    assert watcher.poll() == 6 and engine.version == 6
    assert versions_in(engine.updates[0][0]) == {6.0}
    assert watcher.poll() is None  # nothing new


def test_damaged_or_unmarked_directories_are_not_loadable(tmp_path, model_config, shapes):
    publisher = WeightsPublisher(tmp_path, model_config)
    good = publisher.publish(1, filled(shapes, 1))
    copy = tmp_path / "v000002"
    copy.mkdir()
    for entry in good.iterdir():
        if entry.name != COMPLETE_MARKER:
            (copy / entry.name).write_bytes(entry.read_bytes())
    with pytest.raises(IncompleteWeightsError, match="no COMPLETE"):
        check_complete(copy)
    (copy / COMPLETE_MARKER).write_text((good / COMPLETE_MARKER).read_text())
    with pytest.raises(IncompleteWeightsError, match="version 1"):
        check_complete(copy)  # a marker of another version
    marker = json.loads((good / COMPLETE_MARKER).read_text())
    (copy / COMPLETE_MARKER).write_text(json.dumps(marker | {"version": 2}))
    assert check_complete(copy) == 2
    weights_file = next(copy.glob("*.safetensors"))
    weights_file.write_bytes(weights_file.read_bytes()[:-8])  # a truncated copy
    with pytest.raises(IncompleteWeightsError, match="bytes"):
        check_complete(copy)
    assert latest_complete(tmp_path).version == 1
    assert load_latest(tmp_path)[0] == 1


def test_writer_failing_mid_write_leaves_nothing_loadable(tmp_path, model_config, shapes, monkeypatch):
    queue = LocalTrajectoryQueue()
    publisher = WeightsPublisher(tmp_path, model_config, queue=queue)
    publisher.publish(1, filled(shapes, 1))

    def crash(directory, version, **fields):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(publisher_module, "write_complete_marker", crash)
    with pytest.raises(KeyboardInterrupt):
        publisher.publish(2, filled(shapes, 2))
    assert any(".partial-" in p.name for p in tmp_path.iterdir())  # the debris is there
    assert [v.version for v in complete_versions(tmp_path)] == [1]
    assert queue.latest_weights().version == 1
    assert versions_in(load_latest(tmp_path)[2]) == {1.0}


KILLED_WRITER = """
import os, signal, sys
import jax, numpy as np
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.weights.publisher import WeightsPublisher
config = ModelConfig.preset("tiny")
shapes = jax.eval_shape(lambda: init_params(config))
publisher = WeightsPublisher(sys.argv[1], config)
publisher.publish(1, jax.tree.map(lambda s: np.full(s.shape, 1, np.float32), shapes))
real_rename = os.rename
def rename(source, target):
    if str(target).endswith("v000002"):  # everything written, marker included
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(source, target)
os.rename = rename
publisher.publish(2, jax.tree.map(lambda s: np.full(s.shape, 2, np.float32), shapes))
"""


def test_sigkill_before_the_rename_leaves_only_the_previous_version(tmp_path, model_config, shapes):
    result = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
        cwd=ROOT,
        env=os.environ | {"JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == -9, result.stderr[-2000:]
    partial = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert len(partial) == 1 and (partial[0] / COMPLETE_MARKER).is_file()
    assert [v.version for v in complete_versions(tmp_path)] == [1]
    assert versions_in(load_latest(tmp_path)[2]) == {1.0}
    WeightsPublisher(tmp_path, model_config).publish(2, filled(shapes, 2))  # cleans the debris
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000001", "v000002"]


def test_concurrent_reader_never_sees_a_partial_version(tmp_path, model_config, shapes):
    publisher = WeightsPublisher(tmp_path, model_config, keep=2)
    last = 8
    seen: list[int] = []
    mixed: list[tuple[int, set]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set() or not seen or seen[-1] != last:
            loaded = load_latest(tmp_path)
            if loaded is None:
                continue
            version, _, params = loaded
            values = versions_in(params)
            if values != {float(version)}:
                mixed.append((version, values))
            seen.append(version)

    reader = threading.Thread(target=read)
    reader.start()
    for version in range(1, last + 1):
        publisher.publish(version, filled(shapes, version))
    done.set()
    reader.join(timeout=120)
    assert not reader.is_alive()
    assert mixed == []
    assert seen[-1] == last and seen == sorted(seen)


def test_watcher_swaps_published_weights_into_the_jax_engine(tmp_path, model_config, shapes):
    from pyvision_jax.processing.tokenizer import load_tiny_tokenizer
    from pyvision_jax.rollout.jax_engine import JaxEngine

    engine = JaxEngine(model_config, filled(shapes, 0), load_tiny_tokenizer(), length_buckets=(64,))
    queue = LocalTrajectoryQueue()
    WeightsPublisher(tmp_path, model_config, queue=queue).publish(2, filled(shapes, 2))
    assert WeightsWatcher(queue, engine).poll() == 2
    assert engine.version == 2 and versions_in(engine.params) == {2.0}


def test_hf_tensors_watcher_pushes_the_published_safetensors_even_when_pruned(tmp_path):
    class PairsEngine:
        version, pushed = 0, None

        def update_weights(self, weights, version):
            self.pushed = {name: tensor.float().numpy() for name, tensor in weights}
            self.version = version

    config = ModelConfig.preset("tiny")
    params = jax.tree.map(np.asarray, init_params(config, seed=1))
    queue = LocalTrajectoryQueue()
    engine = PairsEngine()
    watcher = HfTensorsWatcher(queue, engine)
    queue.publish_weights(2, str(tmp_path / "v000002"))  # announced, never written
    assert watcher.poll() is None and engine.pushed is None
    path = WeightsPublisher(tmp_path, config, queue=queue, frozen_groups=("visual",)).publish(3, params)
    assert watcher.poll() == 3 and engine.version == 3
    expected = dict(hf_tensors(config, params))
    assert sorted(engine.pushed) == sorted(expected)  # the trainable file and the frozen tower's
    for name, array in expected.items():
        np.testing.assert_array_equal(engine.pushed[name], np.asarray(array).astype(BF16).astype(np.float32))
    assert watcher.poll() is None
    version, tensors = open_hf_tensors(path)
    shutil.rmtree(path)  # pruned after opening: the open files still stream every tensor
    assert version == 3 and len(dict(tensors)) == len(expected)


def test_weights_inbox_loads_only_the_newest_offer_once():
    class Engine:
        version, loads = 0, []

        def update_weights(self, weights, version):
            self.loads.append((weights, version))
            self.version = version

    engine = Engine()
    inbox = WeightsInbox(engine)
    assert inbox.poll() is None
    inbox.offer("params-1", 1)
    inbox.offer("params-2", 2)
    assert inbox.poll() == 2 and engine.loads == [("params-2", 2)]
    assert inbox.poll() is None
    with pytest.raises(ValueError):
        inbox.offer("bad", -1)


def without_visual(params):
    return {group: value for group, value in params.items() if group != "visual"}


def test_versions_hold_the_trainable_groups_in_bf16_and_name_the_frozen_tower_written_once(
    tmp_path, model_config, shapes
):
    publisher = WeightsPublisher(tmp_path, model_config, frozen_groups=("visual",))
    with pytest.raises(ValueError, match="needs the frozen groups"):
        publisher.publish(1, without_visual(filled(shapes, 1)))
    publisher.publish(1, filled(shapes, 1))
    for version in (2, 3, 4):
        publisher.publish(version, without_visual(filled(shapes, version)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frozen-v000001", "v000003", "v000004"]
    assert sorted(p.name for p in (tmp_path / "v000004").glob("*.safetensors")) == [TRAINABLE_FILE]
    fp32_bytes = sum(np.prod(s.shape) * 4 for g, s in shapes.items() if g != "visual" for s in jax.tree.leaves(s))
    trainable_bytes = (tmp_path / "v000004" / TRAINABLE_FILE).stat().st_size
    assert fp32_bytes / 2 <= trainable_bytes < fp32_bytes / 2 + 65536  # bf16, header aside
    assert (tmp_path / "frozen-v000001" / FROZEN_FILE).is_file()
    version, _, params = load_weights(tmp_path / "v000004", dtype="float32")  # an fp32 engine's load
    assert version == 4 and {leaf.dtype for leaf in jax.tree.leaves(params)} == {np.dtype(np.float32)}
    assert versions_in(params["visual"]) == {1.0} and versions_in(without_visual(params)) == {4.0}
    shutil.rmtree(tmp_path / "frozen-v000001")
    with pytest.raises(IncompleteWeightsError):
        check_complete(tmp_path / "v000004")


def test_watcher_reads_the_frozen_tower_once_and_casts_for_its_engine(tmp_path, model_config, shapes, monkeypatch):
    reads = []
    real_load_hf = loading.load_hf

    def spying(path, **kwargs):
        reads.append(kwargs["include"] is None)
        return real_load_hf(path, **kwargs)

    monkeypatch.setattr(loading, "load_hf", spying)
    queue = LocalTrajectoryQueue()
    publisher = WeightsPublisher(tmp_path, model_config, queue=queue, frozen_groups=("visual",))
    engine = RecordingEngine()
    watcher = WeightsWatcher(queue, engine, dtype="float32")
    publisher.publish(1, filled(shapes, 1))
    assert watcher.poll() == 1
    publisher.publish(2, without_visual(filled(shapes, 2)))
    assert watcher.poll() == 2 and reads == [True, False]  # the second read skipped the tower
    params = engine.updates[-1][0]
    assert jax.tree.structure(params) == jax.tree.structure(shapes)
    assert versions_in(params["visual"]) == {1.0} and versions_in(without_visual(params)) == {2.0}
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {np.dtype(np.float32)}
