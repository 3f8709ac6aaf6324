"""The SFT loop on a hand-made file of the released schema (with images): it trains, writes
checkpoints and TensorBoard scalars, exports HF safetensors that load back, and a rerun
resumes instead of starting over."""

import json

import numpy as np
import pytest
from PIL import Image

from configs.sft_tiny import get_config
from pyvision_jax.convert import load_hf
from pyvision_jax.data.sft_rows import SftFormatError
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.train.sft_data import batch_indices
from pyvision_jax.wiring import export_dir, train_sft
from tests.train.tensorboard_events import read_scalars

FIRST = "<image_clue_0><image></image_clue_0>\n\nHow many red squares are there?"
TOOL = "<tool_response>\n<interpreter>\nText Result:\n{n}\nImage Result:\n</interpreter>\n\n</tool_response>"


def _write_file(folder, rows=4):
    lines = []
    for i in range(rows):
        Image.new("RGB", (84, 56), (20 * i, 100, 30)).save(folder / f"im{i}.png")
        lines.append(
            {
                "conversations": [
                    {"role": "user", "content": FIRST},
                    {"role": "assistant", "content": "I will count.\n<code>\n```python\nprint(%d)\n```\n</code>" % i},
                    {"role": "user", "content": TOOL.format(n=i)},
                    {"role": "assistant", "content": "<answer>\n\\boxed{%d}\n</answer>" % i},
                ],
                "images": [f"im{i}.png"],
                "source_dataset": "hand_made",
            }
        )
    path = folder / "sft.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _config(path, steps):
    c = get_config()
    c.model.preset = "tiny"
    c.sft.train_files = (str(path),)
    c.sft.batch_size = 4
    c.train.steps = steps
    c.train.micro_batch = 2
    c.train.length_buckets = (512,)
    c.train.checkpoint_every = 1
    c.train.lr = 3e-3
    c.train.warmup_steps = 0
    return c


def test_sft_trains_exports_and_resumes(tmp_path):
    path = _write_file(tmp_path)
    workdir = tmp_path / "run"
    lines = []
    summary = train_sft(_config(path, 3), workdir, progress=False, log=lines.append)
    assert (summary.first_step, summary.last_step, summary.interrupted) == (0, 3, False)
    losses = read_scalars(summary.tensorboard_dir)[tags.SFT_LOSS]
    assert len(losses) == 3 and all(np.isfinite(v) for _, v in losses)
    assert losses[-1][1] < losses[0][1]
    model, params = load_hf(export_dir(_config(path, 3), workdir), progress=False)
    assert model.hidden_size == 64 and "lm_head" in params
    resumed = train_sft(_config(path, 4), workdir, progress=False, log=lines.append)
    assert (resumed.first_step, resumed.last_step) == (3, 4)
    assert any("resumed" in line for line in lines)


def test_malformed_rows_stop_the_run_with_the_row_and_field(tmp_path):
    path = _write_file(tmp_path, rows=2)
    path.write_text(path.read_text().replace('"images": ["im1.png"]', '"images": []'))
    with pytest.raises(SftFormatError, match=r"line 2: field images: 0 images for 1 <image> placeholders"):
        train_sft(_config(path, 1), tmp_path / "run", progress=False, log=lambda line: None)


def test_batches_depend_only_on_the_step_and_cover_each_epoch():
    first_epoch = [i for step in range(3) for i in batch_indices(12, 4, step, seed=5)]
    assert sorted(first_epoch) == list(range(12))
    assert batch_indices(12, 4, 4, seed=5) == batch_indices(12, 4, 4, seed=5)
    assert first_epoch != [i for step in range(3, 6) for i in batch_indices(12, 4, step, seed=5)]


def test_a_share_outside_zero_one_stops_the_run_naming_the_field(tmp_path):
    config = _config(tmp_path / "unused.jsonl", 1)
    config.sft.train_files = ()
    config.sft.guess_share = 1.5
    with pytest.raises(ValueError, match=r"sft.guess_share = 1.5"):
        train_sft(config, tmp_path / "run", progress=False, log=lambda line: None)
