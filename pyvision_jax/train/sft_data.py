"""The SFT stage's samples: released-schema files, or synthetic trajectories made on first use.

`sft.train_files` lists released-schema JSON/JSONL files; when it is empty, synthetic tasks
(seed `sft.synthetic_seed`, kinds `data.synthetic_kinds`) are written under
`WORKDIR/sft_data/tasks` and their scripted solutions run through the real episode code and
sandbox into `WORKDIR/sft_data/sft.jsonl` (kept for reruns). Rows are rendered to samples as
the RL episode renders turns; rows longer than the largest of `train.length_buckets` are
left out and counted.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections
import numpy as np

from pyvision_jax import wiring
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data import synthetic
from pyvision_jax.data.sft_rows import load_sft_rows
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.models import ModelConfig
from pyvision_jax.train.sft_render import SftRenderer
from pyvision_jax.train.sft_synthetic import SFT_FILE, write_synthetic_sft

SFT_DATA_DIR = "sft_data"


@dataclasses.dataclass(frozen=True)
class SftSamples:
    samples: tuple[Trajectory, ...]
    files: tuple[str, ...]
    too_long: int


def synthetic_sft_file(config: ml_collections.ConfigDict, workdir: str | os.PathLike, model: ModelConfig,
                       tokenizer: Any, log: Callable[[str], None] = print) -> Path:
    """`WORKDIR/sft_data/sft.jsonl`, generated when absent (see the module docstring)."""
    out_dir = Path(workdir) / SFT_DATA_DIR
    path = out_dir / SFT_FILE
    if path.is_file():
        return path
    s = config.sft
    if min(s.guess_share, s.wrong_share) < 0 or s.guess_share + s.wrong_share > 1:
        raise ValueError(f"sft.guess_share = {s.guess_share!r}, sft.wrong_share = {s.wrong_share!r}: shares of "
                         "the scripted plans, each >= 0 and at most 1 together")
    kinds = wiring.str_tuple(config.data.synthetic_kinds, "data.synthetic_kinds")
    files = synthetic.generate_synthetic_suite(out_dir / "tasks", s.synthetic_per_kind, s.synthetic_seed, kinds)
    tasks = [task for file in files.values() for task in load_tasks(file).tasks]
    with wiring.sandbox_pool(config) as sandboxes:
        report = write_synthetic_sft(tasks, out_dir, tokenizer=tokenizer, sandboxes=sandboxes,
                                     episode=wiring.episode_config(config, model), per_task=s.rollouts_per_task,
                                     seed=s.synthetic_seed, guess_share=s.guess_share,
                                     wrong_share=s.wrong_share)
    log(f"synthetic SFT data: {report.rows} trajectories in {report.path} (dropped {report.dropped}); "
        f"plans {report.strategies}")
    return path


def load_sft_samples(config: ml_collections.ConfigDict, workdir: str | os.PathLike, model: ModelConfig,
                     tokenizer: Any, log: Callable[[str], None] = print) -> SftSamples:
    """Every sample of `sft.train_files` (or of the synthetic file), rendered."""
    files = wiring.str_tuple(config.sft.train_files, "sft.train_files")
    if not files:
        files = (str(synthetic_sft_file(config, workdir, model, tokenizer, log)),)
    renderer = SftRenderer(tokenizer, wiring.episode_config(config, model))
    longest = max(wiring.int_tuple(config.train.length_buckets, "train.length_buckets"))
    samples, too_long = [], 0
    for file in files:
        for row in load_sft_rows(file):
            sample = renderer.render(row)
            if len(sample.token_ids) > longest:
                too_long += 1
            else:
                samples.append(sample)
    if not samples:
        raise ValueError(f"no SFT sample fits train.length_buckets (largest {longest}) in {list(files)}")
    return SftSamples(tuple(samples), tuple(files), too_long)


def batch_indices(num_samples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The sample indices of `step`'s batch: consecutive slices of one seeded permutation
    per epoch, so a resumed run draws what an uninterrupted one would."""
    orders: dict[int, np.ndarray] = {}
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_samples)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(num_samples)
        indices.append(int(orders[epoch][offset]))
    return indices
