"""Weight publishing off the trainer's critical path, for a model of more than 1 GB.

Builds random fp32 params of a cut-down 3B config (--layers decoder layers, --vision-depth
vision blocks: by default 1.3 GB of trainable weights in bf16) and publishes them through
the trainer's real path (`FleetSource.publish`: a jitted bf16 snapshot, then the
`BackgroundPublisher` thread writing versioned atomic directories, the frozen vision tower
once). While a version is written, the "trainer" keeps running jitted steps on the params
(donating them, as the real step does); during the last one it waits, which gives the time
per GB of the writer alone. Prints for each version the bytes written, the
publish time and time per GB, the time the trainer was blocked in `publish`, and their ratio
(target < 10 %); and, as the reference measured in the same run, the synchronous path:
`save_hf` of the whole model in fp32 inside the trainer loop.

  .venv/bin/python -m benchmarks.weight_publish [--layers 4] [--vision-depth 8] [--versions 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pyvision_jax.convert import save_hf
from pyvision_jax.models import ModelConfig, init_params
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.rollout.sources import FleetSource
from pyvision_jax.rollout.weights import WeightsPublisher

GB = 1e9


class TimedPublisher(WeightsPublisher):
    """The shared-filesystem transport, timing each publish in its (background) thread."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timings: dict[int, tuple[float, int]] = {}
        self.done: dict[int, threading.Event] = {}

    def publish(self, version, params):
        start = time.perf_counter()
        path = super().publish(version, params)
        written = sum(f.stat().st_size for f in path.iterdir())
        if self.frozen and int(self.frozen.rsplit("v", 1)[1]) == version:
            written += sum(f.stat().st_size for f in (self.directory / self.frozen).iterdir())
        self.timings[version] = (time.perf_counter() - start, written)
        self.done.setdefault(version, threading.Event()).set()
        return path


def random_params(config: ModelConfig) -> dict:
    shapes = jax.eval_shape(lambda: init_params(config))
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    make = jax.jit(lambda key, shape: 0.02 * jax.random.normal(key, shape, jnp.float32), static_argnums=1)
    return jax.tree.unflatten(treedef, [make(k, s.shape) for k, s in zip(keys, leaves)])


def nbytes(tree, dtype_size: int) -> int:
    return sum(int(np.prod(leaf.shape)) * dtype_size for leaf in jax.tree.leaves(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vision-depth", type=int, default=8)
    parser.add_argument("--versions", type=int, default=4, help="at least 2")
    args = parser.parse_args()

    base = ModelConfig.preset("3b")
    config = base.replace(
        num_hidden_layers=args.layers,
        vision=dataclasses.replace(base.vision, depth=args.vision_depth, fullatt_block_indexes=(3,)),
    )
    params = random_params(config)
    jax.block_until_ready(params)
    trainable = {g: v for g, v in params.items() if g != "visual"}
    print(
        f"model: {nbytes(params, 4) / GB:.2f} GB fp32; published: trainable {nbytes(trainable, 2) / GB:.2f} GB "
        f"bf16 each version, vision tower {nbytes(params['visual'], 2) / GB:.2f} GB bf16 once"
    )

    step = jax.jit(lambda p: jax.tree.map(lambda x: x * (1.0 - 1e-7), p), donate_argnums=0)
    step(jax.tree.map(jnp.copy, params))  # compiled before timing
    with tempfile.TemporaryDirectory(prefix="weight_publish_") as tmp:
        publisher = TimedPublisher(Path(tmp) / "weights", config, frozen_groups=("visual",))
        source = FleetSource(
            LocalTrajectoryQueue(), publisher, DeliveredGroups(None, "bench"), publish_every=1, wait_timeout_s=60
        )
        rows = []
        for version in range(args.versions):
            start = time.perf_counter()
            if version == 0:
                source.start(params, 0, {})
            else:
                source.publish(params, version)
            blocked = time.perf_counter() - start
            done = publisher.done.setdefault(version, threading.Event())
            steps = 0
            idle = version == args.versions - 1  # the last version: the trainer waits (time per GB alone)
            while not done.is_set() and not idle:  # the trainer goes on while the version is written
                params = step(params)
                jax.block_until_ready(params)
                steps += 1
            source.sync.flush()
            seconds, written = publisher.timings[version]
            rows.append((version, written, seconds, blocked, "idle" if idle else steps))
        source.close()
        start = time.perf_counter()
        save_hf(config, params, Path(tmp) / "reference", progress=False)
        reference = time.perf_counter() - start
        size = sum(f.stat().st_size for f in (Path(tmp) / "reference").iterdir())
    report(rows, reference, size)


def report(rows: list[tuple], reference: float, size: int) -> None:
    print(
        f"{'version':>7} {'written GB':>10} {'publish s':>9} {'s per GB':>8} {'blocked ms':>10} "
        f"{'blocked/publish':>15} {'steps meanwhile':>15}"
    )
    for version, written, seconds, blocked, steps in rows:
        print(
            f"{version:>7} {written / GB:>10.2f} {seconds:>9.2f} {seconds / (written / GB):>8.2f} "
            f"{blocked * 1e3:>10.1f} {blocked / seconds:>15.2%} {steps:>15}"
        )
    stepping = [r for r in rows if r[0] > 0 and r[4] != "idle"] or rows
    mean_publish = sum(r[2] for r in stepping) / max(len(stepping), 1)
    print(
        f"reference (synchronous): save_hf of the whole model in fp32, {size / GB:.2f} GB, {reference:.2f} s "
        f"({reference / (size / GB):.2f} s per GB), all of it blocking the trainer"
    )
    print(
        f"trainer blocked per version: {1e3 * max(r[3] for r in stepping):.1f} ms at most (background) vs "
        f"{reference:.2f} s (synchronous); a version is on disk {mean_publish:.2f} s after the step"
    )


if __name__ == "__main__":
    main()
