"""Benchmark evaluation: every task k times through the agent loop, scored, summarized.

``Evaluator`` takes any ``Engine`` (the JAX sampler, vLLM, or the scripted test engine), so
what it measures is exactly the episode the trainer runs, with the evaluation budgets.

Outputs in ``out_dir``:
- ``trajectories.jsonl``: one line per rollout (``records.trajectory_record``), the k lines
  of a task appended together with one write as soon as the task is done;
- ``media/``: the records' images, one file per distinct image (a task's image once);
- ``results.json``: settings (seeds included), metrics (``metrics.summarize``), progress and
  wall time; rewritten atomically after every task;
- ``report.html``: the trajectory viewer (``report.write_report``), its images in ``media/``;
- ``settings.json``: what a resumed run must agree with.

Resuming: a rerun with the same out_dir reads trajectories.jsonl, keeps the tasks whose k
rollouts are all there and runs only the others. Lines of unfinished tasks (a crash while
writing) are dropped by rewriting the file atomically first.

Seeds: every generation call uses ``SamplingParams.seed = settings.seed``; engines derive each
request's randomness from that seed and the request id ``"{task_id}/{rollout_index}"``, so a
rollout's samples depend neither on which tasks share its batch nor on resuming.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm import tqdm

from pyvision_jax.agent.engine import Engine, SamplingParams
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner, SandboxSource
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data.tasks import Task, read_video_info
from pyvision_jax.eval import metrics
from pyvision_jax.eval.records import (
    RESULTS_FILE,
    SETTINGS_FILE,
    TRAJECTORIES_FILE,
    MediaFiles,
    append_jsonl,
    finished_tasks,
    iter_finished,
    rewrite_jsonl,
    trajectory_record,
    write_json_atomic,
)
from pyvision_jax.eval.report import write_report
from pyvision_jax.grading.routes import ScorerRoutes, grade_trajectories
from pyvision_jax.grading.scoring import GroundTruthError
from pyvision_jax.grading.trajectory import score_task_response
from pyvision_jax.processing.tokens import video_token_count

_PRESENTATION_SETTINGS = ("report", "report_rollouts_per_task", "progress")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Sampling and bookkeeping of one evaluation (all recorded in results.json).

    ``tasks_per_batch`` tasks (k rollouts each) run through the episode runner together;
    0 picks enough for four times the runner's ``max_concurrent`` episodes, so that few
    slots idle while the last episodes of a batch finish. ``report_rollouts_per_task``
    (0: all) limits the trajectories per task shown in report.html (it grows with k).
    """

    k: int = 32
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    tasks_per_batch: int = 0
    report: bool = True
    report_rollouts_per_task: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"EvalSettings.k must be >= 1, got {self.k}")
        for name in ("tasks_per_batch", "report_rollouts_per_task"):
            if getattr(self, name) < 0:
                raise ValueError(f"EvalSettings.{name} must be >= 0, got {getattr(self, name)}")

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed)


def check_ground_truths(tasks: Sequence[Task]) -> None:
    """Raises before any generation when a task's ground truth cannot be scored (a data
    error that would otherwise stop the evaluation when the task is reached)."""
    probe = "<answer>\n\\boxed{0}\n</answer>"
    for task in tasks:
        try:
            score_task_response(probe, task)
        except GroundTruthError as err:
            raise ValueError(f"task {task.id} ({task.data_source}): {err}") from None


def uniform_video_tokens(
    task: Task, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2, sample_fps: float = 1.0
) -> int | None:
    """Visual tokens of the task's whole video sampled uniformly at ``sample_fps`` through the
    Qwen2.5-VL video processor (None for image tasks)."""
    if not task.is_video:
        return None
    info = read_video_info(task.video_path)
    return video_token_count(
        info.num_frames,
        info.width,
        info.height,
        info.fps,
        sample_fps=sample_fps,
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
    )


class Evaluator:
    """Runs, scores and records an evaluation with an injected engine and sandbox source."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        sandboxes: SandboxSource,
        episode: EpisodeConfig = EpisodeConfig.evaluation(),
        settings: EvalSettings = EvalSettings(),
        run_info: Mapping[str, Any] | None = None,
        temporal_patch_size: int = 2,
        routes: ScorerRoutes = ScorerRoutes(),
    ) -> None:
        self.engine = engine
        self.routes = routes
        self.tokenizer = tokenizer
        self.episode = episode
        self.settings = settings
        self.run_info = dict(run_info or {})
        self.temporal_patch_size = temporal_patch_size
        self.runner = EpisodeRunner(engine, tokenizer, sandboxes, episode, settings.sampling())

    def settings_record(self) -> dict[str, Any]:
        """What a resumed run must agree with (sampling, budgets, seeds)."""
        e = self.episode
        return {
            **{
                key: value
                for key, value in dataclasses.asdict(self.settings).items()
                if key not in _PRESENTATION_SETTINGS
            },
            "request_seed": "SamplingParams.seed=seed for every call; per-request streams "
            "from (seed, request id '{task_id}/{rollout_index}')",
            "max_tool_calls": e.max_tool_calls,
            "max_images": e.max_images,
            "max_new_tokens_per_turn": e.max_new_tokens_per_turn,
            "max_total_tokens": e.max_total_tokens,
            "on_error": e.on_error,
            "image_min_pixels": e.image_min_pixels,
            "image_max_pixels": e.image_max_pixels,
        }

    def _check_settings(self, out_dir: Path) -> None:
        wanted = json.loads(json.dumps(self.settings_record()))
        path = out_dir / SETTINGS_FILE
        if path.is_file():
            stored = json.loads(path.read_text())
            changed = sorted(
                key
                for key in set(stored) | set(wanted)
                if stored.get(key) != wanted.get(key) and key != "tasks_per_batch"
            )
            if changed:
                raise ValueError(
                    f"{out_dir} holds an evaluation with other settings ({', '.join(changed)}: "
                    f"{ {k: stored.get(k) for k in changed} } there, "
                    f"{ {k: wanted.get(k) for k in changed} } now); use another --out"
                )
        else:
            write_json_atomic(path, wanted)

    def _tasks_per_batch(self) -> int:
        if self.settings.tasks_per_batch:
            return self.settings.tasks_per_batch
        return max(1, math.ceil(4 * self.episode.max_concurrent / self.settings.k))

    def run(self, tasks: Sequence[Task], out_dir: str | os.PathLike) -> dict[str, Any]:
        """Evaluates ``tasks`` (skipping those already finished in ``out_dir``); returns the
        results dict also written to results.json."""
        start = time.perf_counter()
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        ids = [t.id for t in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("task ids must be unique")
        check_ground_truths(tasks)
        self._check_settings(out_dir)
        jsonl = out_dir / TRAJECTORIES_FILE
        k = self.settings.k
        _, dirty = finished_tasks(jsonl, k)
        if dirty:
            rewrite_jsonl(jsonl, (r for records in iter_finished(jsonl, k) for r in records))
        previous_wall = 0.0
        if (out_dir / RESULTS_FILE).is_file():
            previous_wall = float(json.loads((out_dir / RESULTS_FILE).read_text()).get("wall_time_s_all_runs", 0.0))
        known = set(ids)
        outcomes = {
            records[0]["task_id"]: [metrics.RolloutOutcome.from_record(r) for r in records]
            for records in iter_finished(jsonl, k)
            if records[0]["task_id"] in known
        }
        media = MediaFiles(out_dir)
        todo = [t for t in tasks if t.id not in outcomes]
        skipped = len(tasks) - len(todo)

        def results(complete: bool) -> dict[str, Any]:
            wall = time.perf_counter() - start
            return {
                "complete": complete,
                "num_tasks_total": len(tasks),
                "num_tasks_done": sum(t.id in outcomes for t in tasks),
                "num_tasks_skipped_as_finished": skipped,
                "settings": self.settings_record(),
                "run": self.run_info,
                "engine": type(self.engine).__name__,
                "policy_version": self.engine.version,
                **metrics.summarize(o for t in tasks for o in outcomes.get(t.id, ())),
                "wall_time_s": wall,
                "wall_time_s_all_runs": previous_wall + wall,
            }

        bar = tqdm(
            total=len(tasks), initial=skipped, desc="eval tasks", unit="task", disable=not self.settings.progress
        )
        try:
            step = self._tasks_per_batch()
            for first in range(0, len(todo), step):
                chunk = todo[first : first + step]
                trajectories = self.runner.run_trajectories([(task, i) for task in chunk for i in range(k)])
                for n, task in enumerate(chunk):
                    task_records = self._score_task(task, trajectories[n * k : (n + 1) * k], media)
                    append_jsonl(jsonl, task_records)
                    outcomes[task.id] = [metrics.RolloutOutcome.from_record(r) for r in task_records]
                    bar.update(1)
                partial = results(complete=False)
                bar.set_postfix(acc=f"{partial['accuracy']:.3f}", avg_k=f"{partial['avg_at_k']:.3f}")
                write_json_atomic(out_dir / RESULTS_FILE, partial)
        finally:
            bar.close()
        final = results(complete=True)
        write_json_atomic(out_dir / RESULTS_FILE, final)
        if self.settings.report:
            write_report(out_dir, self.settings.report_rollouts_per_task or None)
        return final

    def _score_task(self, task: Task, trajectories: Sequence[Trajectory], media: MediaFiles) -> list[dict[str, Any]]:
        if [t.task_id for t in trajectories] != [task.id] * self.settings.k:
            raise RuntimeError(f"task {task.id}: the episode runner returned {[t.task_id for t in trajectories]}")
        uniform = uniform_video_tokens(task, self.episode.patch_size, self.episode.merge_size, self.temporal_patch_size)
        graded = grade_trajectories([(t, task) for t in trajectories], self.tokenizer, self.routes)
        return [
            trajectory_record(task, t, g.score, self.tokenizer, uniform, grading_failed=g.broken, media=media)
            for t, g in zip(trajectories, graded)
        ]
