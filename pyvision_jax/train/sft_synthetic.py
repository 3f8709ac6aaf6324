"""Synthetic SFT data: scripted solutions run through the real episode code and sandbox.

Each plan of `data.sft_solutions` is replayed by a `ScriptedEngine` inside the
`EpisodeRunner`, so code really runs in the sandbox and every observation (printed text,
plotted images) is the real one; the answer turn copies what the last code printed. Each
finished episode is written as a row of the released SFT schema (its images as PNG files
beside the JSONL), which the SFT trainer then loads like any released file.
"""

from __future__ import annotations

import functools
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pyvision_jax.agent.engine import GenerationRequest
from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.prompts import TEXT_RESULT
from pyvision_jax.agent.runner import EpisodeRunner, SandboxSource
from pyvision_jax.agent.trajectory import EndReason, Trajectory
from pyvision_jax.data.sft_rows import IMAGE_PLACEHOLDER, SftMessage, SftRow, write_sft_rows
from pyvision_jax.data.sft_solutions import RESULT_SLOT, SolutionPlan, solution_plan
from pyvision_jax.data.shape_plans import shape_plan
from pyvision_jax.data.shape_tasks import DATA_SOURCE as SHAPES_SOURCE
from pyvision_jax.data.tasks import Task
from pyvision_jax.rollout.scripted_engine import ScriptedEngine

SFT_FILE = "sft.jsonl"
_VISION_RUN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")
_MESSAGE = re.compile(r"<\|im_start\|>(system|user)\n(.*?)<\|im_end\|>\n", re.DOTALL)


@dataclass(frozen=True)
class SyntheticSftReport:
    """What a generation run wrote: rows kept, episodes dropped by end reason, plans used."""

    path: Path
    rows: int
    dropped: dict[str, int]
    strategies: dict[str, int]


def plan_script(plan_for: Callable[[str], SolutionPlan], tokenizer: Any):
    """The ScriptedEngine script: the turn of the request's plan (`plan_for(request id)`), the
    answer filled with the last printed text."""

    def respond(request: GenerationRequest, turn: int) -> str:
        text = plan_for(request.request_id).turns[turn]
        if RESULT_SLOT in text:
            context = tokenizer.decode(list(request.prompt_token_ids), skip_special_tokens=False)
            printed = TEXT_RESULT.findall(context)
            text = text.replace(RESULT_SLOT, printed[-1].strip().splitlines()[-1] if printed else "")
        return text

    return respond


def _chat_messages(text: str, where: str) -> list[SftMessage]:
    """The messages of rendered chat text (`<|im_start|>role\n...<|im_end|>` blocks), each run
    of image tokens as one `<image>` placeholder."""
    found = _MESSAGE.findall(text)
    if not found:
        raise ValueError(f"{where}: no chat message in {text[:200]!r}")
    return [SftMessage(role, _VISION_RUN.sub(IMAGE_PLACEHOLDER, content)) for role, content in found]


def trajectory_row(trajectory: Trajectory, task: Task, tokenizer: Any, image_dir: Path, eos_id: int) -> SftRow:
    """A finished episode as a released-schema row; its images are written under `image_dir`
    (the task image as the original file, code images as the PNGs the model saw)."""
    ids = trajectory.token_ids.tolist()
    decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
    messages = _chat_messages(decode(ids[: trajectory.prompt_length]), task.id)
    for turn in trajectory.turns:
        generated = ids[turn.generated_start : turn.generated_end]
        if turn is trajectory.turns[-1] and generated and generated[-1] == eos_id:
            generated = generated[:-1]
        messages.append(SftMessage("assistant", decode(generated)))
        if turn.observation_end > turn.generated_end:
            messages += _chat_messages(decode(ids[turn.generated_end : turn.observation_end]), task.id)
    paths = []
    for k, image in enumerate(trajectory.images):
        path = image_dir / f"{task.id}_{trajectory.rollout_index}_{k}.png"
        if image.source == "task":
            shutil.copyfile(task.image_path, path)
        else:
            path.write_bytes(image.png)
        paths.append(str(path.resolve()))
    return SftRow(tuple(messages), tuple(paths), task.data_source, f"{task.id}/{trajectory.rollout_index}")


def draw_plans(
    tasks: Sequence[Task],
    per_task: int,
    seed: int,
    guess_share: float,
    wrong_share: float,
    careful_share: float = 0.0,
    wording_by_options: bool = False,
) -> dict[str, SolutionPlan]:
    """`per_task` plans of every task, keyed by request id `"{task id}/{k}"`; each plan's
    draw depends only on (seed, task position, k). Shapes tasks draw `data.shape_plans`
    (`guess_share`, `careful_share`, `wording_by_options`), the other kinds `data.sft_solutions`."""

    def plan(task: Task, rng: np.random.Generator) -> SolutionPlan:
        if task.data_source == SHAPES_SOURCE:
            return shape_plan(
                task, rng, guess_share=guess_share, careful_share=careful_share, wording_by_options=wording_by_options
            )
        return solution_plan(task, rng, guess_share=guess_share, wrong_share=wrong_share)

    return {
        f"{task.id}/{k}": plan(task, np.random.default_rng([seed, t, k]))
        for t, task in enumerate(tasks)
        for k in range(per_task)
    }


def run_plans(
    tasks: Sequence[Task],
    plans: dict[str, SolutionPlan],
    *,
    tokenizer: Any,
    sandboxes: SandboxSource,
    episode: EpisodeConfig,
    progress: bool = False,
) -> list[Trajectory]:
    """The episode of every plan (keys `"{task id}/{k}"` of `tasks`), in plan order."""
    by_id = {task.id: task for task in tasks}
    jobs = [(by_id[key.rsplit("/", 1)[0]], int(key.rsplit("/", 1)[1])) for key in plans]
    engine = ScriptedEngine(tokenizer, plan_script(plans.__getitem__, tokenizer), merge_size=episode.merge_size)
    return EpisodeRunner(engine, tokenizer, sandboxes, episode).run_trajectories(jobs, progress=progress)


def write_synthetic_sft(
    tasks: Sequence[Task],
    out_dir: str | Path,
    *,
    tokenizer: Any,
    sandboxes: SandboxSource,
    episode: EpisodeConfig,
    per_task: int,
    seed: int,
    guess_share: float,
    wrong_share: float,
    careful_share: float = 0.0,
    wording_by_options: bool = False,
    progress: bool = False,
) -> SyntheticSftReport:
    """Runs `per_task` drawn plans of every task and writes `out_dir/sft.jsonl` with the
    episodes that ended with an answer (DONE)."""
    out_dir = Path(out_dir)
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    plans = draw_plans(tasks, per_task, seed, guess_share, wrong_share, careful_share, wording_by_options)
    trajectories = run_plans(tasks, plans, tokenizer=tokenizer, sandboxes=sandboxes, episode=episode, progress=progress)
    by_id = {task.id: task for task in tasks}
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows, dropped = [], Counter()
    for trajectory in trajectories:
        if trajectory.end_reason is EndReason.DONE:
            rows.append(trajectory_row(trajectory, by_id[trajectory.task_id], tokenizer, image_dir, eos_id))
        else:
            dropped[trajectory.end_reason.value] += 1
    path = out_dir / SFT_FILE
    write_sft_rows(path, rows)
    strategies = Counter(plan.strategy for plan in plans.values())
    return SyntheticSftReport(path, len(rows), dict(dropped), dict(sorted(strategies.items())))
