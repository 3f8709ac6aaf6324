"""Validation during GRPO training (`train.validator.Validator`): the released script's
`data.val_files` / `trainer.test_freq` / `trainer.val_before_train`.

At each due step (0 when `before_training`, every `every_steps`, and the run's last step)
the current params are evaluated on the validation tasks into WORKDIR/validation/step_N/ (an
ordinary evaluation: results.json, trajectories.jsonl, report.html; `eval.evaluate`), and its
headline figures become TensorBoard scalars of step N under WORKDIR/tb/validation/ (a run of
its own beside the training events): accuracy overall and per data source, avg@k, pass@k,
tool calls, response length, grading failures and the share of each end reason
(`validation_scalars`).

Exactly once: a validation is finished when step_N/scalars.json exists, written after its
scalars. A rerun skips finished validations; an unfinished one resumes its evaluation (the
tasks already done are kept) and first drops whatever scalars a killed attempt wrote for
that step, so every validation step appears once in TensorBoard. Validations of steps after
the one a run resumes from are removed (`forget_after`): their params are recomputed.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from pyvision_jax.convert.run_layout import TB_DIR, VALIDATION_DIR
from pyvision_jax.eval.records import write_json_atomic
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.run_logs.metrics import MetricsWriter
from pyvision_jax.run_logs.run_outputs import truncate_events

SCALARS_FILE = "scalars.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")

Evaluate = Callable[[Any, int, Path], Mapping[str, Any]]
"""(params, step, out_dir) -> the evaluation's results (`eval.evaluate.Evaluator.run`)."""


@dataclasses.dataclass(frozen=True)
class ValidationSchedule:
    """When to validate (config keys eval.every_steps, eval.before_training; `last_step` is
    train.steps). Step 0 when `before_training`; with `every_steps` > 0, every multiple of
    it and the last step, as the released trainer does."""

    every_steps: int
    before_training: bool
    last_step: int

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ValueError(f"eval.every_steps must be >= 0, got {self.every_steps}")
        if not self.every_steps and not self.before_training:
            raise ValueError("data.val_files is set but eval.every_steps is 0 and eval.before_training is False")

    def due(self, step: int) -> bool:
        if step == 0:
            return self.before_training
        return self.every_steps > 0 and (step % self.every_steps == 0 or step == self.last_step)


def validation_scalars(results: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one evaluation's results (`eval.metrics.summarize`)."""
    scalars = {
        tags.VAL_ACCURACY: float(results["accuracy"]),
        tags.VAL_AVG_AT_K: float(results["avg_at_k"]),
        tags.VAL_PASS_AT_K: float(results["pass_at_k"]),
        tags.VAL_TOOL_CALLS: float(results["tool_calls"]["mean"]),
        tags.VAL_RESPONSE_LENGTH: float(results["mean_response_tokens"]),
        tags.VAL_GRADING_FAILURES: float(results["num_grading_failures"]),
    }
    for source, summary in results["per_data_source"].items():
        scalars[tags.val_accuracy_tag(source)] = float(summary["accuracy"])
    ended = results["end_reasons"]
    total = sum(ended.values())
    for reason, count in ended.items():
        scalars[tags.val_end_reason_tag(reason)] = count / total if total else 0.0
    return scalars


class TrainingValidation:
    """Validations of one run in `workdir` at the steps of `schedule`, each evaluated by
    `evaluate(params, step, out_dir)`."""

    def __init__(self, workdir: str | Path, schedule: ValidationSchedule, evaluate: Evaluate):
        self.root = Path(workdir) / VALIDATION_DIR
        self.tb_dir = Path(workdir) / TB_DIR / tags.VALIDATION_TB_DIR
        self.schedule = schedule
        self._evaluate = evaluate

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def finished(self, step: int) -> bool:
        return (self.step_dir(step) / SCALARS_FILE).is_file()

    def pending(self, step: int) -> bool:
        return self.schedule.due(step) and not self.finished(step)

    def validate(self, params: Any, step: int) -> dict[str, float]:
        out_dir = self.step_dir(step)
        scalars = validation_scalars(self._evaluate(params, step, out_dir))
        truncate_events(self.tb_dir, step - 1)  # a killed attempt's scalars of this step
        with MetricsWriter(self.tb_dir) as writer:
            writer.write(step, scalars)
        write_json_atomic(out_dir / SCALARS_FILE, {"step": step, "scalars": scalars})
        return scalars

    def forget_after(self, step: int) -> None:
        truncate_events(self.tb_dir, step)
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and int(match.group(1)) > step and path.is_dir():
                shutil.rmtree(path)
