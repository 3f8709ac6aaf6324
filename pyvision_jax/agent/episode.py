"""The multi-turn episode of one trajectory: generate -> parse -> run code -> observe.

State machine of one trajectory (``EpisodeState``, moved by ``EpisodeMachine``)::

    START --(render prompt)--> GENERATE --answer--------------------------------> DONE
                                  |  --length cut, no answer------------------> OVER_LENGTH
                                  |  --malformed, on_error=terminate----------> ERROR_IN_ACTION
                                  |  --code or malformed+feedback, budget spent-> EXCEED_MAX_TURNS
                                  v
                                 TOOL (sandbox run / format feedback)
                                  |  --sandbox infrastructure raised-----------> SANDBOX_FAILURE
                                  |  --code error/timeout, on_error=terminate--> ERROR_IN_ACTION
                                  |  --too many images-------------------------> EXCEED_MAX_IMAGES
                                  |  --observation would overflow the context--> OVER_LENGTH
                                  v
                               append turn end + observation + assistant header -> GENERATE

Token-in/token-out: the context is a list of token ids that only ever grows. Generated ids
are appended verbatim (loss_mask 1, the engine's logprobs); the turn end, the observation
user turn and the next assistant header are rendered with the chat template on their own and
appended (loss_mask 0). Nothing already in the context is decoded and re-encoded, so the ids
after turn k are a prefix of the ids after turn k + 1.

The machine does no engine or sandbox calls itself: the driver
(``pyvision_jax.agent.runner.EpisodeRunner``) makes them and hands their results in.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from PIL import Image

from pyvision_jax.agent.engine import GenerationRequest, GenerationResult
from pyvision_jax.agent.parse import ACTION_SYNTAXES, Action, ActionKind, parse_action
from pyvision_jax.agent.prompts import (
    OBSERVATION_FORMATS,
    ChatRenderer,
    PromptTemplates,
    default_prompt_templates,
    image_prompt_messages,
    observation_content,
    video_prompt_messages,
)
from pyvision_jax.agent.trajectory import ContextImage, EndReason, Trajectory, TurnRecord
from pyvision_jax.data.tasks import Task, read_video_info
from pyvision_jax.processing.image import IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS, resize_rgb, smart_resize, to_rgb
from pyvision_jax.processing.tokens import num_visual_tokens

CODE_STOP = "</code>"
TURN_BOUNDARIES = ("im_end", "newline")
IMAGE_CAP_RULES = ("exceed", "reach")
STDOUT_STRIPS = ("right", "both")


@dataclass(frozen=True)
class EpisodeConfig:
    """Budgets and policies of one episode (defaults: the training recipe).

    max_tool_calls: observations (code runs and format feedback) per trajectory; code in the
      turn after the last one ends it with EXCEED_MAX_TURNS (4 train, 30 eval).
    max_images: images in the context, the task image included.
    max_new_tokens_per_turn / max_total_tokens: generation limit of one turn / the whole
      context, image tokens included; an observation that would not leave room for one more
      token ends the trajectory with OVER_LENGTH before it is added.
    max_response_tokens: when > 0, also a limit on everything after the prompt (generated
      and observation tokens; the released recipe's 20,480), enforced the same way.
    on_error: "terminate" ends on a malformed action or failed code (ERROR_IN_ACTION);
      "feedback" shows the error as the observation, at the cost of a tool call.
    broken_end_reasons: end reasons the trainer treats as broken (a set of EndReason or of
      their names, or one comma-separated string).
    image_min_pixels / image_max_pixels: Qwen2.5-VL resize bounds of images in the context.
    action_syntax: "tagged" (ours) or "released" (``agent.parse``).
    turn_boundary: what follows a turn's ``</code>`` before the observation's user turn:
      "im_end" (ours: the template's turn end ``<|im_end|>\\n``) or "newline" (released: ``\\n``).
    image_cap_rule: "exceed" (ours: end when the images would exceed ``max_images``) or
      "reach" (released: end when they would reach it).
    stdout_strip: "right" (ours: trailing whitespace of the printed text trimmed) or "both"
      (released).
    observation_format: "full" (ours: ``Text Result:`` and ``Image Result:`` sections always)
      or "released" (an image section only with images; a newline after ``<interpreter>``
      only without; ``prompts.observation_content``).
    prompts: the first-prompt templates (default: ``configs/prompts/``).
    max_concurrent: trajectories in flight (and pool threads).
    gather_s: after a pool job finishes, how long the driver waits at most for others to
      finish too, so they join the same generation batch (never waits for all).
    setup_code: trusted Python run in each episode's sandbox before the model's first code
      (helper functions the prompt names; "" none); it is not part of the context.
    """

    max_tool_calls: int = 4
    max_images: int = 32
    max_new_tokens_per_turn: int = 10_240
    max_total_tokens: int = 32_768
    max_response_tokens: int = 0
    on_error: Literal["terminate", "feedback"] = "terminate"
    broken_end_reasons: frozenset[EndReason] = frozenset({EndReason.SANDBOX_FAILURE})
    image_min_pixels: int = IMAGE_MIN_PIXELS
    image_max_pixels: int = IMAGE_MAX_PIXELS
    action_syntax: str = "tagged"
    turn_boundary: str = "im_end"
    image_cap_rule: str = "exceed"
    stdout_strip: str = "right"
    observation_format: str = "full"
    prompts: PromptTemplates = field(default_factory=default_prompt_templates)
    patch_size: int = 14
    merge_size: int = 2
    max_concurrent: int = 8
    gather_s: float = 0.05
    sandbox_acquire_timeout_s: float | None = 600.0
    setup_code: str = ""

    def __post_init__(self) -> None:
        if self.on_error not in ("terminate", "feedback"):
            raise ValueError(f"EpisodeConfig.on_error must be 'terminate' or 'feedback', got {self.on_error!r}")
        for name in ("max_images", "max_new_tokens_per_turn", "max_total_tokens", "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"EpisodeConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name, allowed in (
            ("action_syntax", ACTION_SYNTAXES),
            ("turn_boundary", TURN_BOUNDARIES),
            ("image_cap_rule", IMAGE_CAP_RULES),
            ("stdout_strip", STDOUT_STRIPS),
            ("observation_format", OBSERVATION_FORMATS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"EpisodeConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.max_response_tokens < 0:
            raise ValueError(
                f"EpisodeConfig.max_response_tokens must be >= 0 (0: no limit), got {self.max_response_tokens}"
            )
        if self.max_tool_calls < 0:
            raise ValueError(f"EpisodeConfig.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        reasons = self.broken_end_reasons
        if isinstance(reasons, str):
            raise ValueError(
                f"EpisodeConfig.broken_end_reasons must be a sequence of end reason names, got the string {reasons!r}"
            )
        try:
            reasons = frozenset(EndReason(r) for r in reasons)
        except ValueError as err:
            raise ValueError(
                f"EpisodeConfig.broken_end_reasons: {err}; expected names from {[r.value for r in EndReason]}"
            ) from None
        object.__setattr__(self, "broken_end_reasons", reasons)

    @classmethod
    def training(cls, **overrides: Any) -> "EpisodeConfig":
        return cls(**({"max_tool_calls": 4} | overrides))

    @classmethod
    def evaluation(cls, **overrides: Any) -> "EpisodeConfig":
        return cls(**({"max_tool_calls": 30} | overrides))


def context_image(
    image: Image.Image, label: int, source: str, config: EpisodeConfig
) -> tuple[ContextImage, Image.Image]:
    """Resizes an image to its Qwen2.5-VL context size; returns the record and the resized
    image (what the engine sees)."""
    rgb = to_rgb(image)
    factor = config.patch_size * config.merge_size
    height, width = smart_resize(
        rgb.height, rgb.width, factor=factor, min_pixels=config.image_min_pixels, max_pixels=config.image_max_pixels
    )
    resized = Image.fromarray(resize_rgb(rgb, height, width))
    buffer = io.BytesIO()
    resized.save(buffer, format="PNG")
    grid = (1, height // config.patch_size, width // config.patch_size)
    tokens = num_visual_tokens(grid, config.merge_size)
    return ContextImage(label, source, buffer.getvalue(), grid, tokens), resized


@dataclass
class EpisodeState:
    """Mutable state of one trajectory; touched by one thread at a time."""

    task: Task
    rollout_index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    images: list[ContextImage] = field(default_factory=list)
    engine_images: list[Image.Image] = field(default_factory=list)
    runtime_images: dict[str, Image.Image | str] = field(default_factory=dict)
    """What the sandbox defines as each `image_clue_i`: an image, or the file it reads as is."""
    next_label: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    end_reason: EndReason | None = None
    final_answer: str | None = None
    started_at: float = 0.0
    generate_s: float = 0.0
    tool_s: float = 0.0

    @property
    def request_id(self) -> str:
        return f"{self.task.id}/{self.rollout_index}"

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        if logprobs is None:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(logprobs)

    def end(self, record: TurnRecord, reason: EndReason) -> None:
        """Records the last turn and ends the trajectory."""
        self.turns.append(record)
        self.end_reason = reason


@dataclass(frozen=True)
class TaskPrompt:
    """The rendered first prompt of a task, shared by its rollouts (images are read-only)."""

    token_ids: tuple[int, ...]
    images: tuple[ContextImage, ...]
    engine_images: tuple[Image.Image, ...]
    runtime_images: dict[str, Image.Image | str]


@dataclass(frozen=True)
class PendingAction:
    """A turn that ended with an action needing the tool step (code to run or feedback)."""

    action: Action
    result: GenerationResult
    generated_start: int


class EpisodeMachine:
    """The transitions of one episode under ``config``; each call moves one
    ``EpisodeState`` (see the module docstring). The driver calls ``begin`` once, then
    ``request``/``after_generation`` per turn and, for a pending action, ``show_feedback``
    (malformed action) or the outcome of its sandbox run (``after_run``, ``fail_run``,
    ``fail_preload``), and finally ``trajectory``."""

    def __init__(self, config: EpisodeConfig, renderer: ChatRenderer):
        self.config = config
        self.renderer = renderer

    def render_prompt(self, task: Task) -> TaskPrompt:
        """The task's first prompt (reads its image or the video's metadata)."""
        if task.is_video:
            messages = video_prompt_messages(task, read_video_info(task.video_path), self.config.prompts.video)
            return TaskPrompt(tuple(self.renderer.prompt_ids(messages)), (), (), {})
        with Image.open(task.image_path) as opened:
            original = to_rgb(opened)
            # an RGB file is what the runtime's own RGB conversion reads: it gets the file, not
            # an image to re-encode per rollout (a 1280x960 PNG costs the host ~0.1 s)
            as_is = opened.mode == "RGB" and opened.info.get("transparency") is None
        record, resized = context_image(original, 0, "task", self.config)
        messages = image_prompt_messages(task, original.width, original.height, self.config.prompts.image)
        return TaskPrompt(
            tuple(self.renderer.prompt_ids(messages, [record.grid_thw])),
            (record,),
            (resized,),
            {"image_clue_0": str(task.image_path) if as_is else original},
        )

    def begin(self, episode: EpisodeState, prompt: TaskPrompt) -> None:
        """START: puts the prompt in the context (OVER_LENGTH when it leaves no room)."""
        episode.append(prompt.token_ids)
        episode.prompt_length = len(prompt.token_ids)
        episode.images.extend(prompt.images)
        episode.engine_images.extend(prompt.engine_images)
        episode.runtime_images.update(prompt.runtime_images)
        episode.next_label = len(prompt.images)
        if self.room(episode) < 1:
            episode.end_reason = EndReason.OVER_LENGTH

    def room(self, episode: EpisodeState, adding: int = 0) -> int:
        """Tokens the budgets leave after the context and `adding` more tokens."""
        used = len(episode.token_ids) + adding
        room = self.config.max_total_tokens - used
        if self.config.max_response_tokens:
            room = min(room, self.config.max_response_tokens - (used - episode.prompt_length))
        return room

    def request(self, episode: EpisodeState) -> GenerationRequest:
        """The generation request continuing the episode's context."""
        room = self.room(episode)
        return GenerationRequest(
            request_id=episode.request_id,
            prompt_token_ids=tuple(episode.token_ids),
            images=tuple(episode.engine_images),
            image_grid_thw=[im.grid_thw for im in episode.images],
            max_new_tokens=min(room, self.config.max_new_tokens_per_turn),
        )

    def after_generation(self, episode: EpisodeState, output: GenerationResult) -> PendingAction | None:
        """Appends the generated ids and decides the next step; returns the pending action,
        or None after setting the end reason."""
        start = len(episode.token_ids)
        episode.append(output.token_ids, output.logprobs)
        action = parse_action(self.renderer.decode(output.token_ids), self.config.action_syntax)
        record = TurnRecord(
            start,
            len(episode.token_ids),
            len(episode.token_ids),
            output.finish_reason,
            action.kind.value,
            output.policy_version,
        )
        if action.kind is ActionKind.ANSWER:
            episode.final_answer = action.answer
            episode.end(record, EndReason.DONE)
        elif output.finish_reason == "length":
            episode.end(record, EndReason.OVER_LENGTH)
        elif action.kind.malformed and self.config.on_error == "terminate":
            episode.end(record, EndReason.ERROR_IN_ACTION)
        elif episode.num_tool_calls >= self.config.max_tool_calls:
            episode.end(record, EndReason.EXCEED_MAX_TURNS)
        else:
            return PendingAction(action, output, start)
        return None

    def show_feedback(self, episode: EpisodeState, pending: PendingAction) -> None:
        """TOOL for a malformed action: its format error is the observation."""
        feedback = pending.action.feedback
        self._observe(episode, _turn_fields(episode, pending), feedback, [], error=feedback)

    def fail_run(self, episode: EpisodeState, pending: PendingAction, err: Exception) -> None:
        """TOOL when the sandbox's infrastructure (not the model's code) raised."""
        episode.end(
            TurnRecord(**_turn_fields(episode, pending), tool_error=f"sandbox failure: {err!r}"),
            EndReason.SANDBOX_FAILURE,
        )

    def after_run(self, episode: EpisodeState, pending: PendingAction, result: Any) -> list[tuple[str, Image.Image]]:
        """TOOL with the sandbox's ``RunResult`` of the action's code: appends the
        observation or sets an end reason. Returns the (runtime name, image) bindings of the
        new images, which the driver preloads into the sandbox."""
        episode.tool_s += result.wall_time_s
        turn = _turn_fields(episode, pending) | {"tool_wall_s": result.wall_time_s}
        error = _run_error(result)
        if error is None:
            return self._observe(episode, turn, self._text_result(result.stdout, None), list(result.images), error=None)
        if self.config.on_error == "terminate":
            episode.end(TurnRecord(**turn, tool_error=error), EndReason.ERROR_IN_ACTION)
            return []
        return self._observe(episode, turn, self._text_result(result.stdout, error), [], error=error)

    @staticmethod
    def fail_start(episode: EpisodeState) -> None:
        """START when the task's media could not be read: nothing enters the context and the
        episode is broken (an infrastructure failure, never trained on)."""
        episode.end_reason = EndReason.SANDBOX_FAILURE

    @staticmethod
    def fail_preload(episode: EpisodeState, err: Exception) -> None:
        """Ends the episode when a new image could not be preloaded into the sandbox."""
        episode.end_reason = EndReason.SANDBOX_FAILURE
        episode.turns[-1] = dataclasses.replace(episode.turns[-1], tool_error=f"sandbox failure: {err!r}")

    def trajectory(self, episode: EpisodeState, default_version: int, wall_s: float) -> Trajectory:
        """The finished episode as a Trajectory; ``default_version`` is its policy version
        when it has no generated turn."""
        reason = episode.end_reason
        versions = [t.policy_version for t in episode.turns]
        return Trajectory(
            task_id=episode.task.id,
            rollout_index=episode.rollout_index,
            token_ids=episode.token_ids,
            loss_mask=episode.loss_mask,
            logprobs=episode.logprobs,
            prompt_length=episode.prompt_length,
            images=tuple(episode.images),
            turns=tuple(episode.turns),
            num_tool_calls=episode.num_tool_calls,
            num_successful_tool_calls=episode.num_successful_tool_calls,
            end_reason=reason,
            broken=reason in self.config.broken_end_reasons,
            final_answer=episode.final_answer,
            policy_version=min(versions) if versions else default_version,
            timings={"generate_s": episode.generate_s, "tool_s": episode.tool_s, "wall_s": wall_s},
        )

    def _observe(
        self, episode: EpisodeState, turn: dict[str, Any], text: str, images: list[Image.Image], error: str | None
    ) -> list[tuple[str, Image.Image]]:
        """Checks the budgets, then appends turn end + observation + assistant header and
        binds the new images in the runtime; returns those bindings."""
        count = len(episode.images) + len(images)
        if count > self.config.max_images or (
            self.config.image_cap_rule == "reach" and count >= self.config.max_images
        ):
            episode.end(TurnRecord(**turn, tool_error=error), EndReason.EXCEED_MAX_IMAGES)
            return []
        try:
            rendered = [context_image(im, episode.next_label + i, "code", self.config) for i, im in enumerate(images)]
        except ValueError as err:  # e.g. an aspect ratio Qwen2.5-VL cannot take
            if self.config.on_error == "terminate":
                episode.end(TurnRecord(**turn, tool_error=str(err)), EndReason.ERROR_IN_ACTION)
                return []
            error = f"Error: an image could not be shown: {err}"
            text, images, rendered = _with_error(text, error), [], []
        records = [r for r, _ in rendered]
        labels = [r.label for r in records]
        observation = self._turn_end(episode, turn) + self.renderer.observation_ids(
            observation_content(text, labels, self.config.observation_format), [r.grid_thw for r in records]
        )
        if self.room(episode, len(observation)) < 1:
            episode.end(TurnRecord(**turn, tool_error=error), EndReason.OVER_LENGTH)
            return []
        episode.append(observation)
        episode.images.extend(records)
        episode.engine_images.extend(resized for _, resized in rendered)
        episode.next_label += len(records)
        episode.num_tool_calls += 1
        if error is None:
            episode.num_successful_tool_calls += 1
        episode.turns.append(
            TurnRecord(
                **(turn | {"observation_end": len(episode.token_ids)}), tool_error=error, num_new_images=len(records)
            )
        )
        bindings = [(f"image_clue_{r.label}", image) for r, image in zip(records, images)]
        episode.runtime_images.update(bindings)
        return bindings

    def _turn_end(self, episode: EpisodeState, turn: dict[str, Any]) -> list[int]:
        """What closes the assistant turn before the observation's user turn."""
        if self.config.turn_boundary == "newline":
            return self.renderer.newline_ids
        closing = self.renderer.turn_closing_ids
        if turn["finish_reason"] == "eos" and episode.token_ids[-1] == closing[0]:
            closing = closing[1:]  # the model already ended its turn itself
        return closing

    def _text_result(self, stdout: str, error: str | None) -> str:
        """The observation's text: what the code printed (whitespace trimmed per
        ``stdout_strip``), then the error on its own line."""
        text = stdout.strip() if self.config.stdout_strip == "both" else stdout.rstrip()
        return text if error is None else _with_error(text, error)


def _turn_fields(episode: EpisodeState, pending: PendingAction) -> dict[str, Any]:
    """The TurnRecord fields of the pending action's turn, before its observation."""
    end = len(episode.token_ids)
    output = pending.result
    return dict(
        generated_start=pending.generated_start,
        generated_end=end,
        observation_end=end,
        finish_reason=output.finish_reason,
        action=pending.action.kind.value,
        policy_version=output.policy_version,
    )


def _run_error(result: Any) -> str | None:
    """The error text of a failed run (exception, timeout or crash of the runtime; the
    sandbox restarts a killed runtime itself and says so in the next result's stdout), None
    when the run succeeded."""
    if result.error or result.timed_out:
        return "Error: " + (result.error or "the code timed out").strip()
    return None


def _with_error(text: str, error: str) -> str:
    """``text`` then ``error`` on its own line."""
    return f"{text}\n{error}" if text else error
