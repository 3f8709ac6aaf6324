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
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import SandboxSource
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data import synthetic
from pyvision_jax.data.sft_rows import load_sft_rows
from pyvision_jax.data.tasks import load_tasks
from pyvision_jax.train.sft_render import SftRenderer
from pyvision_jax.train.sft_synthetic import SFT_FILE, write_synthetic_sft

SFT_DATA_DIR = "sft_data"


@dataclasses.dataclass(frozen=True)
class SftSamples:
    samples: tuple[Trajectory, ...]
    files: tuple[str, ...]
    too_long: int


@dataclasses.dataclass(frozen=True)
class SyntheticSftSettings:
    """Synthetic SFT data: `per_kind` tasks of each of `kinds` (seed `seed`), each solved
    `rollouts_per_task` times by the scripted plans, `guess_share` / `wrong_share` of them
    the untooled-guess and wrong-answer plans, `careful_share` the careful plan of shapes tasks,
    `wording_by_options` a shapes plan's first thought worded by what the options differ in
    (config section `sft`)."""

    per_kind: int
    seed: int
    kinds: tuple[str, ...]
    rollouts_per_task: int = 1
    guess_share: float = 0.0
    wrong_share: float = 0.0
    careful_share: float = 0.0
    wording_by_options: bool = False

    def __post_init__(self) -> None:
        for name, other in (("wrong_share", self.wrong_share), ("careful_share", self.careful_share)):
            if min(self.guess_share, other) < 0 or self.guess_share + other > 1:
                raise ValueError(
                    f"sft.guess_share = {self.guess_share!r}, sft.{name} = {other!r}: "
                    "shares of the scripted plans, each >= 0 and at most 1 together"
                )


def synthetic_sft_file(
    settings: SyntheticSftSettings,
    workdir: str | os.PathLike,
    *,
    tokenizer: Any,
    sandboxes: Callable[[], ContextManager[SandboxSource]],
    episode: EpisodeConfig,
    log: Callable[[str], None] = print,
) -> Path:
    """`WORKDIR/sft_data/sft.jsonl`, generated when absent (see the module docstring);
    `sandboxes()` opens the sandbox pool the scripted solutions run in."""
    out_dir = Path(workdir) / SFT_DATA_DIR
    path = out_dir / SFT_FILE
    if path.is_file():
        return path
    s = settings
    files = synthetic.generate_synthetic_suite(out_dir / "tasks", s.per_kind, s.seed, s.kinds)
    tasks = [task for file in files.values() for task in load_tasks(file).tasks]
    with sandboxes() as pool:
        report = write_synthetic_sft(
            tasks,
            out_dir,
            tokenizer=tokenizer,
            sandboxes=pool,
            episode=episode,
            per_task=s.rollouts_per_task,
            seed=s.seed,
            guess_share=s.guess_share,
            wrong_share=s.wrong_share,
            careful_share=s.careful_share,
            wording_by_options=s.wording_by_options,
        )
    log(
        f"synthetic SFT data: {report.rows} trajectories in {report.path} (dropped {report.dropped}); "
        f"plans {report.strategies}"
    )
    return path


def load_sft_samples(files: Sequence[str], renderer: SftRenderer, longest: int) -> SftSamples:
    """Every sample of `files` rendered; rows longer than `longest` tokens are left out."""
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
