"""MetricsWriter writes TensorBoard scalars that read back with tensorboard's own reader."""

import gc
import itertools
import subprocess
import threading

import numpy as np
import pytest

from pyvision_jax.run_logs import event_file, metric_names, metrics
from tests.train.tensorboard_events import read_scalars


def test_every_trainer_scalar_round_trips_with_steps_and_values(tmp_path):
    end_reasons = [metric_names.end_reason_tag(name) for name in ("answer", "max_turns", "max_tokens")]
    names = list(metric_names.TRAINER_SCALARS) + end_reasons
    expected = {name: [] for name in names}
    with metrics.MetricsWriter(tmp_path / "tb") as writer:
        for step in (0, 1, 5):
            scalars = {name: 0.25 * index + step for index, name in enumerate(names)}
            scalars[metric_names.ACTOR_GRAD_NORM] = np.float32(1.5 + step)  # numpy scalar
            scalars[metric_names.FILTER_GROUPS_KEPT] = np.array([16 - step])  # size-1 array
            writer.write(step, scalars)
            for name, value in scalars.items():
                expected[name].append((step, float(np.asarray(value).reshape(()))))
    assert read_scalars(str(tmp_path / "tb")) == expected


def test_flush_makes_scalars_visible_before_close(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(7, {metric_names.REWARD_TOTAL: 0.75})
    writer.flush()
    assert read_scalars(str(tmp_path)) == {metric_names.REWARD_TOTAL: [(7, 0.75)]}
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(8, {metric_names.REWARD_TOTAL: 1.0})


def test_writers_opened_within_one_second_read_back_in_the_order_written(tmp_path, monkeypatch):
    """Validation opens one writer per validated step; files of one second must sort by their
    number (9 before 10), as TensorBoard reads a directory's files in name order."""
    monkeypatch.setattr(event_file.time, "time", lambda: 1_700_000_000.0)
    monkeypatch.setattr(event_file, "_FILE_NUMBERS", itertools.count(5))
    for step in range(0, 24, 2):
        with metrics.MetricsWriter(tmp_path) as writer:
            writer.write(step, {metric_names.VAL_ACCURACY: step / 32})
    assert read_scalars(str(tmp_path)) == {metric_names.VAL_ACCURACY: [(step, step / 32) for step in range(0, 24, 2)]}


def test_bad_values_are_rejected_naming_the_metric_and_nothing_is_written(tmp_path):
    with metrics.MetricsWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match=r"'actor/entropy' at step 2.*shape \(3,\)"):
            writer.write(2, {metric_names.REWARD_TOTAL: 1.0, metric_names.ACTOR_ENTROPY: np.ones(3)})
        with pytest.raises(ValueError, match="'reward/total'.*number"):
            writer.write(2, {metric_names.REWARD_TOTAL: "high"})
        with pytest.raises(ValueError, match="step must be a non-negative integer"):
            writer.write(-1, {metric_names.REWARD_TOTAL: 1.0})
        with pytest.raises(ValueError, match="metric name"):
            writer.write(2, {"": 1.0})
        writer.write(3, {metric_names.REWARD_TOTAL: 0.5})
    assert read_scalars(str(tmp_path)) == {metric_names.REWARD_TOTAL: [(3, 0.5)]}


def test_end_reason_tag_validates_the_name():
    assert metric_names.end_reason_tag("max_turns") == "end_reason/max_turns"
    for bad in ("", "a b", "a/b", None):
        with pytest.raises(ValueError, match="end reason name"):
            metric_names.end_reason_tag(bad)


def test_console_line_shows_known_fields_in_order_and_skips_missing():
    line = metrics.format_console_line(
        3,
        {
            metric_names.PERF_STEP_TIME: 12.345,
            metric_names.REWARD_TOTAL: 0.51234,
            metric_names.REWARD_ACCURACY: np.float32(0.4375),
            metric_names.ACTOR_GRAD_NORM: float("nan"),
            "custom/not_shown": 1.0,
        },
        total_steps=10,
    )
    assert line == "step 3/10 | reward 0.512 | acc 0.438 | gnorm nan | step_s 12.35"
    assert metrics.format_console_line(0, {}) == "step 0"


def test_a_full_disk_raises_at_the_write_in_the_callers_thread_and_prints_nothing(tmp_path, capfd):
    disk = tmp_path / "small_disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        threads_before = threading.active_count()
        writer = metrics.MetricsWriter(disk / "tb")
        assert threading.active_count() == threads_before  # no background writer
        with pytest.raises(metrics.MetricsWriteError, match=r"metrics of step \d+ in .*small_disk/tb.*No space left"):
            for step in range(100_000):
                writer.write(step, {f"padding/{index}": 1.0 for index in range(64)})
        writer.close()
        del writer
        gc.collect()
        assert capfd.readouterr().err == ""
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
