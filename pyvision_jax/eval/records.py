"""The files of an evaluation directory and the trajectory record they hold.

- ``trajectories.jsonl``: one ``trajectory_record`` a line, the k lines of a task appended
  together (``append_jsonl``); ``read_finished`` keeps the tasks whose k lines are all there;
- ``results.json`` and ``settings.json``: written whole and atomically (``write_json_atomic``);
- ``report.html``: the trajectory viewer (``report.write_report``).

Every whole-file write goes through a temporary file renamed over the target, so a crash
leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Sequence

from pyvision_jax.agent.parse import parse_action
from pyvision_jax.agent.prompts import TEXT_RESULT
from pyvision_jax.agent.trajectory import Trajectory
from pyvision_jax.data.tasks import Task
from pyvision_jax.grading.scoring import Score

TRAJECTORIES_FILE = "trajectories.jsonl"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"
SETTINGS_FILE = "settings.json"
_IMAGE_PAD = "<|image_pad|>"


def _decode_collapsed(tokenizer: Any, ids: Sequence[int], image_pad_id: int) -> str:
    """Decoded text with each run of image-pad tokens shown once as ``<|image_pad|>×N``."""
    pieces, i = [], 0
    while i < len(ids):
        j = i
        pad = ids[i] == image_pad_id
        while j < len(ids) and (ids[j] == image_pad_id) == pad:
            j += 1
        if pad:
            pieces.append(f"{_IMAGE_PAD}×{j - i}")
        else:
            pieces.append(tokenizer.decode(list(ids[i:j]), skip_special_tokens=False))
        i = j
    return "".join(pieces)


def trajectory_record(
    task: Task,
    trajectory: Trajectory,
    score: Score,
    tokenizer: Any,
    uniform_tokens: int | None,
    grading_failed: bool = False,
) -> dict[str, Any]:
    """One line of trajectories.jsonl: the metrics fields of ``metrics.RolloutOutcome``, the
    task row, and a decoded view for people (prompt, per-turn text / code / interpreter
    output / images as base64 PNG). Token ids are not kept (see the trainer's samples). A
    rollout whose grading failed (the judge did not answer) counts as broken, never wrong."""
    image_pad_id = tokenizer.convert_tokens_to_ids(_IMAGE_PAD)
    ids = trajectory.token_ids.tolist()
    code_images = [im for im in trajectory.images if im.source == "code"]
    turns, next_image = [], 0
    for turn in trajectory.turns:
        text = tokenizer.decode(ids[turn.generated_start : turn.generated_end], skip_special_tokens=False)
        observation = _decode_collapsed(tokenizer, ids[turn.generated_end : turn.observation_end], image_pad_id)
        interpreter = TEXT_RESULT.search(observation)
        labels = [im.label for im in code_images[next_image : next_image + turn.num_new_images]]
        next_image += turn.num_new_images
        turns.append(
            {
                "text": text,
                "action": turn.action,
                "code": parse_action(text).code,
                "observation": observation,
                "interpreter_text": interpreter.group(1) if interpreter else None,
                "image_labels": labels,
                "tool_error": turn.tool_error,
                "finish_reason": turn.finish_reason,
            }
        )
    return {
        "task_id": task.id,
        "data_source": task.data_source,
        "rollout_index": trajectory.rollout_index,
        "score": float(score.score),
        "correct": bool(score.correct),
        "extracted": score.extracted,
        "num_tool_calls": trajectory.num_tool_calls,
        "num_successful_tool_calls": trajectory.num_successful_tool_calls,
        "end_reason": trajectory.end_reason.value,
        "broken": trajectory.broken or grading_failed,
        "grading_failed": grading_failed,
        "visual_tokens": trajectory.num_visual_tokens,
        "response_tokens": trajectory.num_generated_tokens,
        "total_tokens": len(ids),
        "is_video": task.is_video,
        "uniform_video_tokens": uniform_tokens,
        "final_answer": trajectory.final_answer,
        "policy_version": trajectory.policy_version,
        "timings": dict(trajectory.timings),
        "task": task.to_row(),
        "prompt": _decode_collapsed(tokenizer, ids[: trajectory.prompt_length], image_pad_id),
        "turns": turns,
        "images": [
            {
                "label": im.label,
                "source": im.source,
                "grid_thw": list(im.grid_thw),
                "num_tokens": im.num_tokens,
                "png_base64": base64.b64encode(im.png).decode("ascii"),
            }
            for im in trajectory.images
        ],
    }


def write_text_atomic(path: Path, text: str) -> None:
    """Writes ``text`` (UTF-8) to a temporary file, syncs it and renames it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes JSON to a temporary file and renames it over ``path``."""
    write_text_atomic(path, json.dumps(data, indent=1))


def _jsonl(records: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def rewrite_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Replaces the lines of ``path`` by ``records`` atomically."""
    write_text_atomic(path, _jsonl(records))


def append_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Appends ``records`` to ``path`` with one write, synced before returning."""
    with path.open("a") as f:
        f.write(_jsonl(records))
        f.flush()
        os.fsync(f.fileno())


def read_finished(path: Path, k: int) -> tuple[dict[str, list[dict[str, Any]]], bool]:
    """Records of the tasks whose k rollouts are all in ``path`` (by task id, rollout order),
    and whether the file holds anything else (unfinished tasks, a torn last line)."""
    if not path.is_file():
        return {}, False
    by_task: dict[str, dict[int, dict[str, Any]]] = {}
    dirty = False
    with path.open() as f:
        for line in f:
            try:
                record = json.loads(line)
                task_id, index = record["task_id"], int(record["rollout_index"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                dirty = True
                continue
            by_task.setdefault(task_id, {})[index] = record
    finished = {}
    for task_id, records in by_task.items():
        if sorted(records) == list(range(k)):
            finished[task_id] = [records[i] for i in range(k)]
        else:
            dirty = True
    return finished, dirty
