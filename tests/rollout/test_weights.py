"""Weight publishing: versioned atomic HF directories, announcement, pruning, safe readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout import weights as weights_module
from pyvision_jax.rollout.queue import LocalTrajectoryQueue
from pyvision_jax.rollout.weights import (
    COMPLETE_MARKER,
    IncompleteWeightsError,
    WeightsPublisher,
    WeightsWatcher,
    check_complete,
    complete_versions,
    latest_complete,
    load_latest,
    load_weights,
    update_engines,
)

ROOT = Path(__file__).resolve().parents[2]


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


def test_writer_failing_mid_write_leaves_nothing_loadable(tmp_path, model_config, shapes,
                                                          monkeypatch):
    queue = LocalTrajectoryQueue()
    publisher = WeightsPublisher(tmp_path, model_config, queue=queue)
    publisher.publish(1, filled(shapes, 1))

    def crash(directory, version):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(weights_module, "_write_marker", crash)
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
from pyvision_jax.rollout import weights
config = ModelConfig.preset("tiny")
shapes = jax.eval_shape(lambda: init_params(config))
publisher = weights.WeightsPublisher(sys.argv[1], config)
publisher.publish(1, jax.tree.map(lambda s: np.full(s.shape, 1, np.float32), shapes))
real_rename = os.rename
def rename(source, target):
    if str(target).endswith("v000002"):  # everything written, marker included
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(source, target)
os.rename = rename
publisher.publish(2, jax.tree.map(lambda s: np.full(s.shape, 2, np.float32), shapes))
"""


def test_sigkill_before_the_rename_leaves_only_the_previous_version(tmp_path, model_config,
                                                                    shapes):
    result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=ROOT,
                            env=os.environ | {"JAX_PLATFORMS": "cpu"}, capture_output=True,
                            text=True, timeout=240)
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

    engine = JaxEngine(model_config, filled(shapes, 0), load_tiny_tokenizer(),
                       length_buckets=(64,))
    queue = LocalTrajectoryQueue()
    WeightsPublisher(tmp_path, model_config, queue=queue).publish(2, filled(shapes, 2))
    assert WeightsWatcher(queue, engine).poll() == 2
    assert engine.version == 2 and versions_in(engine.params) == {2.0}
