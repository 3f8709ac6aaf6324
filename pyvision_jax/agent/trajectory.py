"""The record of one episode (``Trajectory``) and of the G rollouts of one prompt
(``TrajectoryGroup``), with compact msgpack bytes (for queues) and JSON (for people).

``token_ids``, ``loss_mask`` and ``logprobs`` are aligned position by position: ``loss_mask``
is 1 exactly on tokens the engine generated, and ``logprobs`` holds the engine's behaviour
logprob there (0 elsewhere). ``images`` are the images that entered the context, in order of
appearance, as PNG bytes at the resolution whose grid their tokens were counted for.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import msgpack
import numpy as np

from pyvision_jax.data.tasks import Task

_FORMAT_VERSION = 1


class EndReason(str, enum.Enum):
    DONE = "DONE"
    EXCEED_MAX_TURNS = "EXCEED_MAX_TURNS"
    ERROR_IN_ACTION = "ERROR_IN_ACTION"
    OVER_LENGTH = "OVER_LENGTH"
    EXCEED_MAX_IMAGES = "EXCEED_MAX_IMAGES"
    SANDBOX_FAILURE = "SANDBOX_FAILURE"


@dataclass(frozen=True)
class ContextImage:
    """An image in the context: ``label`` k of ``<image_clue_k>``, ``source`` "task" or
    "code", the PNG the model saw and its (t, h, w) patch grid."""

    label: int
    source: str
    png: bytes
    grid_thw: tuple[int, int, int]
    num_tokens: int


@dataclass(frozen=True)
class TurnRecord:
    """One assistant turn: generated tokens are ``token_ids[generated_start:generated_end]``,
    the appended non-generated tokens (turn end, observation, next header) run to
    ``observation_end``."""

    generated_start: int
    generated_end: int
    observation_end: int
    finish_reason: str
    action: str
    policy_version: int
    tool_error: str | None = None
    tool_wall_s: float = 0.0
    num_new_images: int = 0


@dataclass(frozen=True)
class Trajectory:
    task_id: str
    rollout_index: int
    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    prompt_length: int
    images: tuple[ContextImage, ...]
    turns: tuple[TurnRecord, ...]
    num_tool_calls: int
    num_successful_tool_calls: int
    end_reason: EndReason
    broken: bool
    final_answer: str | None
    policy_version: int
    timings: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", np.asarray(self.token_ids, np.int32))
        object.__setattr__(self, "loss_mask", np.asarray(self.loss_mask, np.int8))
        object.__setattr__(self, "logprobs", np.asarray(self.logprobs, np.float32))
        object.__setattr__(self, "end_reason", EndReason(self.end_reason))
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id}/{self.rollout_index}: token_ids "
                f"({n}), loss_mask ({len(self.loss_mask)}) and logprobs "
                f"({len(self.logprobs)}) must have one length"
            )

    @property
    def image_grid_thw(self) -> np.ndarray:
        return np.asarray([im.grid_thw for im in self.images], np.int64).reshape(-1, 3)

    @property
    def num_visual_tokens(self) -> int:
        return sum(im.num_tokens for im in self.images)

    @property
    def num_generated_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to_dict(self) -> dict[str, Any]:
        """Plain msgpack-able values; arrays as raw little-endian bytes."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("token_ids", "loss_mask", "logprobs"):
            array = getattr(self, name)
            out[name] = {"dtype": array.dtype.str, "data": array.tobytes()}
        out["end_reason"] = self.end_reason.value
        out["images"] = [vars(im) | {"grid_thw": list(im.grid_thw)} for im in self.images]
        out["turns"] = [vars(t) for t in self.turns]
        out["timings"] = dict(self.timings)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Trajectory":
        d = dict(d)
        for name in ("token_ids", "loss_mask", "logprobs"):
            d[name] = np.frombuffer(d[name]["data"], dtype=np.dtype(d[name]["dtype"])).copy()
        d["images"] = tuple(ContextImage(**(im | {"grid_thw": tuple(im["grid_thw"])})) for im in d["images"])
        d["turns"] = tuple(TurnRecord(**t) for t in d["turns"])
        return cls(**d)

    def to_bytes(self) -> bytes:
        return msgpack.packb({"v": _FORMAT_VERSION, "trajectory": self.to_dict()})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Trajectory":
        return cls.from_dict(_unpack(data)["trajectory"])

    def to_json(self, indent: int | None = 1) -> str:
        """Human-readable JSON: ids as lists, PNGs as base64 strings."""
        d = self.to_dict()
        for name in ("token_ids", "loss_mask", "logprobs"):
            d[name] = getattr(self, name).tolist()
        for im in d["images"]:
            im["png"] = base64.b64encode(im["png"]).decode("ascii")
        return json.dumps(d, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Trajectory":
        d = json.loads(text)
        for name, dtype in (("token_ids", np.int32), ("loss_mask", np.int8), ("logprobs", np.float32)):
            d[name] = np.asarray(d[name], dtype)
            d[name] = {"dtype": d[name].dtype.str, "data": d[name].tobytes()}
        for im in d["images"]:
            im["png"] = base64.b64decode(im["png"])
        return cls.from_dict(d)

    def render_text(self, decode: Callable[[Sequence[int]], str], image_pad_id: int) -> str:
        """The whole context as text, each run of image-pad tokens shown as
        ``<|image_pad|>×N``, with the model-generated spans fenced by ``[[gen]]…[[/gen]]``."""
        pieces: list[str] = []
        ids, mask = self.token_ids.tolist(), self.loss_mask.tolist()
        i = 0
        while i < len(ids):
            j = i
            while j < len(ids) and mask[j] == mask[i] and (ids[j] == image_pad_id) == (ids[i] == image_pad_id):
                j += 1
            if ids[i] == image_pad_id:
                pieces.append(f"<|image_pad|>×{j - i}")
            elif mask[i]:
                pieces.append("[[gen]]" + decode(ids[i:j]) + "[[/gen]]")
            else:
                pieces.append(decode(ids[i:j]))
            i = j
        return "".join(pieces)


@dataclass(frozen=True)
class GroupScores:
    """A group's scores, computed once when the group is produced: per rollout the answer
    score, whether it counts as correct, the successful tool calls, the reward, and whether
    grading failed (e.g. the judge was unreachable: the rollout is then broken; () when none)."""

    scores: tuple[float, ...]
    correct: tuple[bool, ...]
    tool_calls: tuple[int, ...]
    rewards: tuple[float, ...]
    broken: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.broken:
            object.__setattr__(self, "broken", (False,) * len(self.scores))
        sizes = {len(self.scores), len(self.correct), len(self.tool_calls), len(self.rewards), len(self.broken)}
        if len(sizes) != 1:
            raise ValueError(f"group scores of unequal lengths {sorted(sizes)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "scores": list(self.scores),
            "correct": list(self.correct),
            "tool_calls": list(self.tool_calls),
            "rewards": list(self.rewards),
            "broken": list(self.broken),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GroupScores":
        return cls(
            tuple(float(x) for x in d["scores"]),
            tuple(bool(x) for x in d["correct"]),
            tuple(int(x) for x in d["tool_calls"]),
            tuple(float(x) for x in d["rewards"]),
            tuple(bool(x) for x in d.get("broken", ())),
        )


@dataclass(frozen=True)
class TrajectoryGroup:
    """The G rollouts of one task, in rollout order, with their scores once scored."""

    task: Task
    trajectories: tuple[Trajectory, ...]
    scores: GroupScores | None = None

    def __post_init__(self) -> None:
        for t in self.trajectories:
            if t.task_id != self.task.id:
                raise ValueError(f"group of task {self.task.id} holds a trajectory of task {t.task_id}")
        if self.scores is not None and len(self.scores.scores) != len(self.trajectories):
            raise ValueError(
                f"group of task {self.task.id}: {len(self.scores.scores)} scores for {len(self.trajectories)} rollouts"
            )

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def policy_version(self) -> int:
        """The oldest policy version among the rollouts (what staleness is judged by)."""
        return min(t.policy_version for t in self.trajectories)

    @property
    def key(self) -> str:
        """`"{task_id}#{epoch}"` (rollout indices are `epoch * G + k`): the same for a group
        and its regeneration after a crash."""
        first = min(t.rollout_index for t in self.trajectories)
        return f"{self.task.id}#{first // len(self)}"

    def with_scores(self, scores: GroupScores) -> "TrajectoryGroup":
        return TrajectoryGroup(self.task, self.trajectories, scores)

    def _record(self, trajectories: list[Any]) -> dict[str, Any]:
        return {
            "task": self.task.to_row(),
            "trajectories": trajectories,
            "scores": None if self.scores is None else self.scores.to_dict(),
        }

    def to_bytes(self) -> bytes:
        return msgpack.packb({"v": _FORMAT_VERSION, **self._record([t.to_dict() for t in self.trajectories])})

    @classmethod
    def from_bytes(cls, data: bytes) -> "TrajectoryGroup":
        d = _unpack(data)
        row = dict(d["task"])
        row["options"] = tuple(row["options"])
        scores = d.get("scores")
        return cls(
            Task(**row),
            tuple(Trajectory.from_dict(t) for t in d["trajectories"]),
            None if scores is None else GroupScores.from_dict(scores),
        )

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self._record([json.loads(t.to_json(None)) for t in self.trajectories]), indent=indent)


def _unpack(data: bytes) -> dict[str, Any]:
    d = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(d, dict) or d.get("v") != _FORMAT_VERSION:
        raise ValueError(f"not a trajectory record of format version {_FORMAT_VERSION}")
    return d
