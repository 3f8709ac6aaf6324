"""Validation during training, without a trainer: its schedule, its scalars, and each
validation recorded once across a killed attempt and a resume from an earlier step."""

import json

import pytest

from pyvision_jax.eval.metrics import RolloutOutcome, summarize
from pyvision_jax.eval.training_validation import (
    SCALARS_FILE,
    TrainingValidation,
    ValidationSchedule,
    validation_scalars,
)
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.run_logs.metrics import MetricsWriter
from tests.train.tensorboard_events import read_scalars


def outcome(task, source, index, correct, tools, end, response):
    return RolloutOutcome(task, source, index, float(correct), correct, tools, end, 0, response)


RESULTS = summarize(
    [
        outcome("a", "vstar", 0, True, 2, "DONE", 100),
        outcome("a", "vstar", 1, False, 0, "DONE", 50),
        outcome("b", "vstar", 0, True, 1, "DONE", 70),
        outcome("b", "vstar", 1, True, 1, "EXCEED_MAX_TURNS", 80),
        outcome("c", "chart", 0, False, 3, "OVER_LENGTH", 300),
        outcome("c", "chart", 1, False, 1, "DONE", 200),
    ]
)


def test_the_schedule_validates_before_training_every_n_steps_and_at_the_last():
    steps = [s for s in range(6) if ValidationSchedule(2, True, 5).due(s)]
    assert steps == [0, 2, 4, 5]
    assert [s for s in range(8) if ValidationSchedule(3, False, 7).due(s)] == [3, 6, 7]
    assert [s for s in range(8) if ValidationSchedule(0, True, 7).due(s)] == [0]
    with pytest.raises(ValueError, match="eval.every_steps is 0 and eval.before_training is False"):
        ValidationSchedule(0, False, 7)
    with pytest.raises(ValueError, match="eval.every_steps must be >= 0"):
        ValidationSchedule(-1, True, 7)


def test_scalars_carry_accuracy_per_source_tool_calls_length_and_end_reasons():
    scalars = validation_scalars(RESULTS)
    assert scalars[tags.VAL_ACCURACY] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert scalars[tags.val_accuracy_tag("vstar")] == pytest.approx(0.75)
    assert scalars[tags.val_accuracy_tag("chart")] == 0.0
    assert scalars[tags.VAL_TOOL_CALLS] == pytest.approx(8 / 6)
    assert scalars[tags.VAL_RESPONSE_LENGTH] == pytest.approx(800 / 6)
    assert scalars[tags.VAL_PASS_AT_K] == pytest.approx(2 / 3)
    assert scalars[tags.val_end_reason_tag("DONE")] == pytest.approx(4 / 6)
    assert scalars[tags.val_end_reason_tag("EXCEED_MAX_TURNS")] == pytest.approx(1 / 6)
    assert scalars[tags.val_end_reason_tag("OVER_LENGTH")] == pytest.approx(1 / 6)


class CountingEvaluate:
    def __init__(self):
        self.calls = []

    def __call__(self, params, step, out_dir):
        self.calls.append(step)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(RESULTS))
        return RESULTS


def steps_of(tb_dir, tag=tags.VAL_ACCURACY):
    return [step for step, _ in read_scalars(str(tb_dir)).get(tag, [])]


def test_each_validation_is_recorded_once_across_a_killed_attempt_and_a_resume(tmp_path):
    evaluate = CountingEvaluate()
    validation = TrainingValidation(tmp_path, ValidationSchedule(2, True, 6), evaluate)
    assert [s for s in range(7) if validation.pending(s)] == [0, 2, 4, 6]
    validation.validate(None, 0)
    validation.validate(None, 2)
    assert not validation.pending(0) and not validation.pending(2) and validation.pending(4)
    assert json.loads((tmp_path / "validation" / "step_2" / SCALARS_FILE).read_text())["step"] == 2
    # an attempt at step 4 killed after writing its scalars, before marking itself finished
    with MetricsWriter(validation.tb_dir) as writer:
        writer.write(4, validation_scalars(RESULTS))
    rerun = TrainingValidation(tmp_path, ValidationSchedule(2, True, 6), evaluate)
    rerun.forget_after(4)
    assert rerun.pending(4)
    rerun.validate(None, 4)
    assert steps_of(rerun.tb_dir) == [0, 2, 4]
    assert steps_of(rerun.tb_dir, tags.val_accuracy_tag("chart")) == [0, 2, 4]
    # a run resuming from step 1 (its checkpoint at 2 lost) recomputes the params of 2 and 4
    rerun.forget_after(1)
    assert steps_of(rerun.tb_dir) == [0]
    assert sorted(p.name for p in (tmp_path / "validation").iterdir()) == ["step_0"]
    assert rerun.pending(2) and not rerun.pending(0)
    assert evaluate.calls == [0, 2, 4]
