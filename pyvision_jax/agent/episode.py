"""The multi-turn episode: generate -> parse -> run code -> observe, for many trajectories.

State machine of one trajectory (``_Episode``)::

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

Concurrency (``EpisodeRunner.run``). One driver thread owns the engine; a thread pool owns all
per-trajectory host work (loading media and rendering the prompt, sandbox acquisition and
runs, rendering observations, releasing sandboxes). The driver loops:

1. admit queued trajectories up to ``max_concurrent`` (their START job goes to the pool);
2. collect every pool job that has finished, without waiting, moving its trajectory to the
   ready list (or retiring it);
3. if any trajectory is ready, call ``engine.generate`` once on ALL ready trajectories, parse
   the results and hand each trajectory's next step (tool run or finalization) to the pool;
4. only when nothing is ready, block until the first pool job finishes.

So generation is batched over whatever is ready, sandbox work of other trajectories proceeds
meanwhile, and no trajectory waits for a slow sandbox of another: there is no per-turn
barrier. Each trajectory has at most one pool job at a time and the pool has
``max_concurrent`` threads, so jobs never queue behind each other; a START or TOOL job may
block on ``SandboxPool.acquire`` only while other trajectories hold sandboxes, and those
release them from their own threads, so the pool cannot deadlock.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import io
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

from PIL import Image
from tqdm import tqdm

from pyvision_jax.agent.parse import Action, ActionKind, parse_action
from pyvision_jax.agent.prompts import (
    ChatRenderer,
    image_prompt_messages,
    observation_content,
    video_prompt_messages,
)
from pyvision_jax.data.tasks import Task, read_video_info
from pyvision_jax.agent.trajectory import (
    ContextImage,
    EndReason,
    Trajectory,
    TrajectoryGroup,
    TurnRecord,
)
from pyvision_jax.processing.image import (
    IMAGE_MAX_PIXELS,
    IMAGE_MIN_PIXELS,
    resize_rgb,
    smart_resize,
    to_rgb,
)
from pyvision_jax.processing.tokens import num_visual_tokens
from pyvision_jax.agent.engine import Engine, GenerationRequest, GenerationResult, SamplingParams

CODE_STOP = "</code>"


class SandboxLike(Protocol):
    """What the episode uses of ``pyvision_jax.agent.sandbox.Sandbox``."""

    def run(self, code: str) -> Any: ...

    def preload_image(self, name: str, image: Image.Image) -> None: ...

    def preload_video(self, name: str, path: str) -> None: ...


class SandboxSource(Protocol):
    """What the episode uses of ``pyvision_jax.agent.sandbox.SandboxPool``."""

    def acquire(self, timeout_s: float | None = None) -> SandboxLike: ...

    def release(self, sandbox: SandboxLike) -> None: ...


@dataclass(frozen=True)
class EpisodeConfig:
    """Budgets and policies of one episode (defaults: the training recipe).

    max_tool_calls: observations (code runs and format feedback) per trajectory; code in the
      turn after the last one ends it with EXCEED_MAX_TURNS (4 train, 30 eval).
    max_images: images in the context, the task image included.
    max_new_tokens_per_turn / max_total_tokens: generation limit of one turn / the whole
      context, image tokens included; an observation that would not leave room for one more
      token ends the trajectory with OVER_LENGTH before it is added.
    on_error: "terminate" ends on a malformed action or failed code (ERROR_IN_ACTION);
      "feedback" shows the error as the observation, at the cost of a tool call.
    broken_end_reasons: end reasons the trainer treats as broken (a set of EndReason or of
      their names, or one comma-separated string).
    image_min_pixels / image_max_pixels: Qwen2.5-VL resize bounds of images in the context.
    max_concurrent: trajectories in flight (and pool threads).
    gather_s: after a pool job finishes, how long the driver waits at most for others to
      finish too, so they join the same generation batch (never waits for all).
    """

    max_tool_calls: int = 4
    max_images: int = 32
    max_new_tokens_per_turn: int = 10_240
    max_total_tokens: int = 32_768
    on_error: Literal["terminate", "feedback"] = "terminate"
    broken_end_reasons: frozenset[EndReason] = frozenset({EndReason.SANDBOX_FAILURE})
    image_min_pixels: int = IMAGE_MIN_PIXELS
    image_max_pixels: int = IMAGE_MAX_PIXELS
    patch_size: int = 14
    merge_size: int = 2
    max_concurrent: int = 8
    gather_s: float = 0.05
    sandbox_acquire_timeout_s: float | None = 600.0

    def __post_init__(self) -> None:
        if self.on_error not in ("terminate", "feedback"):
            raise ValueError(f"EpisodeConfig.on_error must be 'terminate' or 'feedback', "
                             f"got {self.on_error!r}")
        for name in ("max_images", "max_new_tokens_per_turn", "max_total_tokens",
                     "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"EpisodeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tool_calls < 0:
            raise ValueError(f"EpisodeConfig.max_tool_calls must be >= 0, "
                             f"got {self.max_tool_calls}")
        reasons = self.broken_end_reasons
        if isinstance(reasons, str):  # "A,B" from a config file
            reasons = [r.strip() for r in reasons.split(",") if r.strip()]
        try:
            reasons = frozenset(EndReason(r) for r in reasons)
        except ValueError as err:
            raise ValueError(f"EpisodeConfig.broken_end_reasons: {err}; expected names from "
                             f"{[r.value for r in EndReason]}") from None
        object.__setattr__(self, "broken_end_reasons", reasons)

    @classmethod
    def training(cls, **overrides: Any) -> "EpisodeConfig":
        return cls(**({"max_tool_calls": 4} | overrides))

    @classmethod
    def evaluation(cls, **overrides: Any) -> "EpisodeConfig":
        return cls(**({"max_tool_calls": 30} | overrides))


def context_image(image: Image.Image, label: int, source: str,
                  config: EpisodeConfig) -> tuple[ContextImage, Image.Image]:
    """Resizes an image to its Qwen2.5-VL context size; returns the record and the resized
    image (what the engine sees)."""
    rgb = to_rgb(image)
    factor = config.patch_size * config.merge_size
    height, width = smart_resize(rgb.height, rgb.width, factor=factor,
                                 min_pixels=config.image_min_pixels,
                                 max_pixels=config.image_max_pixels)
    resized = Image.fromarray(resize_rgb(rgb, height, width))
    buffer = io.BytesIO()
    resized.save(buffer, format="PNG")
    grid = (1, height // config.patch_size, width // config.patch_size)
    tokens = num_visual_tokens(grid, config.merge_size)
    return ContextImage(label, source, buffer.getvalue(), grid, tokens), resized


@dataclass
class _Episode:
    """Mutable state of one trajectory; touched by one thread at a time."""

    task: Task
    rollout_index: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    images: list[ContextImage] = field(default_factory=list)
    engine_images: list[Image.Image] = field(default_factory=list)
    runtime_images: dict[str, Image.Image] = field(default_factory=dict)
    next_label: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    num_tool_calls: int = 0
    num_successful_tool_calls: int = 0
    sandbox: SandboxLike | None = None
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


@dataclass(frozen=True)
class _Prompt:
    """The rendered first prompt of a task, shared by its rollouts (images are read-only)."""

    token_ids: tuple[int, ...]
    images: tuple[ContextImage, ...]
    engine_images: tuple[Image.Image, ...]
    runtime_images: dict[str, Image.Image]


class _PromptCache:
    """Renders each task's prompt once per run, whichever rollout asks first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[threading.Lock, list[_Prompt]]] = {}

    def get(self, task: Task, render: Callable[[Task], _Prompt]) -> _Prompt:
        with self._lock:
            lock, slot = self._entries.setdefault(task.id, (threading.Lock(), []))
        with lock:
            if not slot:
                slot.append(render(task))
            return slot[0]


@dataclass(frozen=True)
class _Pending:
    """A turn that ended with an action needing the pool (code to run or feedback)."""

    action: Action
    result: GenerationResult
    generated_start: int


class EpisodeRunner:
    """Runs episodes of tasks with one engine, one tokenizer and a sandbox pool."""

    def __init__(self, engine: Engine, tokenizer: Any, sandboxes: SandboxSource,
                 config: EpisodeConfig = EpisodeConfig(),
                 sampling: SamplingParams = SamplingParams()):
        self.engine = engine
        self.sandboxes = sandboxes
        self.config = config
        self.renderer = ChatRenderer(tokenizer, merge_size=config.merge_size)
        self.sampling = dataclasses.replace(
            sampling, stop=tuple(dict.fromkeys((*sampling.stop, CODE_STOP))),
            max_new_tokens=config.max_new_tokens_per_turn)

    def run(self, tasks: Sequence[Task], group_size: int = 1,
            progress: bool = False) -> list[TrajectoryGroup]:
        """``group_size`` rollouts of every task, grouped per task in task order."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        jobs = [(task, k) for task in tasks for k in range(group_size)]
        trajectories = self.run_trajectories(jobs, progress=progress)
        return [TrajectoryGroup(task, tuple(trajectories[i * group_size:(i + 1) * group_size]))
                for i, task in enumerate(tasks)]

    def run_trajectories(self, jobs: Sequence[tuple[Task, int]],
                         progress: bool = False) -> list[Trajectory]:
        """One trajectory per (task, rollout index), in input order."""
        episodes = [_Episode(task, k) for task, k in jobs]
        queued = deque(episodes)
        order = {id(e): i for i, e in enumerate(episodes)}
        results: list[Trajectory | None] = [None] * len(queued)
        prompts = _PromptCache()
        ready: list[_Episode] = []
        running: dict[futures.Future, tuple[str, _Episode]] = {}
        pool = futures.ThreadPoolExecutor(self.config.max_concurrent,
                                          thread_name_prefix="episode")
        bar = tqdm(total=len(queued), desc="episodes", disable=not progress)
        try:
            while queued or running:
                while queued and len(running) < self.config.max_concurrent:
                    episode = queued.popleft()
                    running[pool.submit(self._start, episode, prompts)] = ("start", episode)
                self._wait_for_work(running)
                for future in [f for f in running if f.done()]:
                    stage, episode = running.pop(future)
                    outcome = future.result()
                    if stage == "finish":
                        results[order[id(episode)]] = outcome
                        bar.update(1)
                    elif episode.end_reason is None:
                        ready.append(episode)
                    else:
                        running[pool.submit(self._finish, episode)] = ("finish", episode)
                if ready:
                    batch, ready = ready, []
                    for episode, step in zip(batch, self._generate(batch)):
                        if step is None:
                            running[pool.submit(self._finish, episode)] = ("finish", episode)
                        else:
                            running[pool.submit(self._tool, episode, step)] = ("tool", episode)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            for episode in episodes:
                if episode.sandbox is not None:
                    self.sandboxes.release(episode.sandbox)
                    episode.sandbox = None
            raise
        finally:
            pool.shutdown(wait=True)
            bar.close()
        return [t for t in results if t is not None]

    # -- driver-thread steps -------------------------------------------------------------

    def _wait_for_work(self, running: dict[futures.Future, Any]) -> None:
        """Blocks until a pool job is done, then briefly lets near-simultaneous ones finish
        too (at most ``gather_s``) so they share one generation batch."""
        futures.wait(list(running), return_when=futures.FIRST_COMPLETED)
        if self.config.gather_s > 0:
            futures.wait([f for f in running if not f.done()], timeout=self.config.gather_s,
                         return_when=futures.ALL_COMPLETED)

    def _generate(self, batch: list[_Episode]) -> list[_Pending | None]:
        requests = [self._request(e) for e in batch]
        start = time.perf_counter()
        outputs = self.engine.generate(requests, self.sampling)
        elapsed = time.perf_counter() - start
        if len(outputs) != len(batch):
            raise RuntimeError(f"engine returned {len(outputs)} results for "
                               f"{len(batch)} requests")
        steps = []
        for episode, output in zip(batch, outputs):
            episode.generate_s += elapsed
            steps.append(self._after_generation(episode, output))
        return steps

    def _request(self, episode: _Episode) -> GenerationRequest:
        room = self.config.max_total_tokens - len(episode.token_ids)
        return GenerationRequest(
            request_id=episode.request_id, prompt_token_ids=tuple(episode.token_ids),
            images=tuple(episode.engine_images),
            image_grid_thw=[im.grid_thw for im in episode.images],
            max_new_tokens=min(room, self.config.max_new_tokens_per_turn))

    def _after_generation(self, episode: _Episode, output: GenerationResult) -> _Pending | None:
        """Appends the generated ids and decides the next step; returns the pool work, or
        None after setting the end reason."""
        start = len(episode.token_ids)
        episode.append(output.token_ids, output.logprobs)
        action = parse_action(self.renderer.decode(output.token_ids))
        record = TurnRecord(start, len(episode.token_ids), len(episode.token_ids),
                            output.finish_reason, action.kind.value, output.policy_version)
        if action.kind is ActionKind.ANSWER:
            episode.final_answer = action.answer
            return self._end(episode, record, EndReason.DONE)
        if output.finish_reason == "length":
            return self._end(episode, record, EndReason.OVER_LENGTH)
        if action.kind.malformed and self.config.on_error == "terminate":
            return self._end(episode, record, EndReason.ERROR_IN_ACTION)
        if episode.num_tool_calls >= self.config.max_tool_calls:
            return self._end(episode, record, EndReason.EXCEED_MAX_TURNS)
        return _Pending(action, output, start)

    @staticmethod
    def _end(episode: _Episode, record: TurnRecord, reason: EndReason) -> None:
        episode.turns.append(record)
        episode.end_reason = reason
        return None

    # -- pool-thread steps ---------------------------------------------------------------

    def _start(self, episode: _Episode, prompts: _PromptCache) -> None:
        episode.started_at = time.perf_counter()
        prompt = prompts.get(episode.task, self._render_prompt)
        episode.append(prompt.token_ids)
        episode.prompt_length = len(prompt.token_ids)
        episode.images.extend(prompt.images)
        episode.engine_images.extend(prompt.engine_images)
        episode.runtime_images.update(prompt.runtime_images)
        episode.next_label = len(prompt.images)
        if episode.prompt_length >= self.config.max_total_tokens:
            episode.end_reason = EndReason.OVER_LENGTH

    def _render_prompt(self, task: Task) -> _Prompt:
        if task.is_video:
            messages = video_prompt_messages(task, read_video_info(task.video_path))
            return _Prompt(tuple(self.renderer.prompt_ids(messages)), (), (), {})
        with Image.open(task.image_path) as opened:
            original = to_rgb(opened)
        record, resized = context_image(original, 0, "task", self.config)
        messages = image_prompt_messages(task, original.width, original.height)
        return _Prompt(tuple(self.renderer.prompt_ids(messages, [record.grid_thw])), (record,),
                       (resized,), {"image_clue_0": original})

    def _tool(self, episode: _Episode, pending: _Pending) -> None:
        """Runs the action's code (or prepares its format feedback) and appends the
        observation, or sets an end reason."""
        action, output = pending.action, pending.result
        end = len(episode.token_ids)
        turn = dict(generated_start=pending.generated_start, generated_end=end,
                    observation_end=end, finish_reason=output.finish_reason,
                    action=action.kind.value, policy_version=output.policy_version)
        if action.kind.malformed:
            self._observe(episode, turn, action.feedback, [], error=action.feedback)
            return
        try:
            result = self._sandbox(episode).run(action.code)
        except Exception as err:  # the sandbox's infrastructure, not the model's code
            self._end(episode, TurnRecord(**turn, tool_error=f"sandbox failure: {err!r}"),
                      EndReason.SANDBOX_FAILURE)
            return
        episode.tool_s += result.wall_time_s
        turn["tool_wall_s"] = result.wall_time_s
        error = _run_error(result)
        if error is not None:
            if self.config.on_error == "terminate":
                self._end(episode, TurnRecord(**turn, tool_error=error),
                          EndReason.ERROR_IN_ACTION)
                return
            self._observe(episode, turn, _text_result(result.stdout, error), [], error=error)
            return
        self._observe(episode, turn, _text_result(result.stdout, None), list(result.images),
                      error=None)

    def _observe(self, episode: _Episode, turn: dict[str, Any], text: str,
                 images: list[Image.Image], error: str | None) -> None:
        """Checks the budgets, then appends turn end + observation + assistant header and
        binds the new images in the runtime."""
        if len(episode.images) + len(images) > self.config.max_images:
            self._end(episode, TurnRecord(**turn, tool_error=error),
                      EndReason.EXCEED_MAX_IMAGES)
            return
        try:
            rendered = [context_image(im, episode.next_label + i, "code", self.config)
                        for i, im in enumerate(images)]
        except ValueError as err:  # e.g. an aspect ratio Qwen2.5-VL cannot take
            if self.config.on_error == "terminate":
                self._end(episode, TurnRecord(**turn, tool_error=str(err)),
                          EndReason.ERROR_IN_ACTION)
                return
            error = f"Error: an image could not be shown: {err}"
            text, images, rendered = _text_result(text, error), [], []
        records = [r for r, _ in rendered]
        labels = [r.label for r in records]
        closing = self.renderer.turn_closing_ids
        if turn["finish_reason"] == "eos" and episode.token_ids[-1] == closing[0]:
            closing = closing[1:]  # the model already ended its turn itself
        observation = closing + self.renderer.observation_ids(
            observation_content(text, labels), [r.grid_thw for r in records])
        if len(episode.token_ids) + len(observation) >= self.config.max_total_tokens:
            self._end(episode, TurnRecord(**turn, tool_error=error), EndReason.OVER_LENGTH)
            return
        episode.append(observation)
        episode.images.extend(records)
        episode.engine_images.extend(resized for _, resized in rendered)
        episode.next_label += len(records)
        episode.num_tool_calls += 1
        if error is None:
            episode.num_successful_tool_calls += 1
        episode.turns.append(TurnRecord(**(turn | {"observation_end": len(episode.token_ids)}),
                                        tool_error=error, num_new_images=len(records)))
        for record, image in zip(records, images):
            episode.runtime_images[f"image_clue_{record.label}"] = image
            if episode.sandbox is not None:
                try:
                    episode.sandbox.preload_image(f"image_clue_{record.label}", image)
                except Exception as err:
                    episode.end_reason = EndReason.SANDBOX_FAILURE
                    episode.turns[-1] = dataclasses.replace(
                        episode.turns[-1], tool_error=f"sandbox failure: {err!r}")
                    return

    def _sandbox(self, episode: _Episode) -> SandboxLike:
        """The episode's sandbox, acquired on first use with the clues preloaded."""
        if episode.sandbox is None:
            sandbox = self.sandboxes.acquire(timeout_s=self.config.sandbox_acquire_timeout_s)
            episode.sandbox = sandbox
            if episode.task.is_video:
                sandbox.preload_video("video_clue_0", episode.task.video_path)
            for name, image in episode.runtime_images.items():
                sandbox.preload_image(name, image)
        return episode.sandbox

    def _finish(self, episode: _Episode) -> Trajectory:
        if episode.sandbox is not None:
            sandbox, episode.sandbox = episode.sandbox, None
            self.sandboxes.release(sandbox)
        reason = episode.end_reason
        versions = [t.policy_version for t in episode.turns]
        return Trajectory(
            task_id=episode.task.id, rollout_index=episode.rollout_index,
            token_ids=episode.token_ids, loss_mask=episode.loss_mask,
            logprobs=episode.logprobs, prompt_length=episode.prompt_length,
            images=tuple(episode.images), turns=tuple(episode.turns),
            num_tool_calls=episode.num_tool_calls,
            num_successful_tool_calls=episode.num_successful_tool_calls,
            end_reason=reason, broken=reason in self.config.broken_end_reasons,
            final_answer=episode.final_answer,
            policy_version=min(versions) if versions else self.engine.version,
            timings={"generate_s": episode.generate_s, "tool_s": episode.tool_s,
                     "wall_s": time.perf_counter() - episode.started_at})


def _run_error(result: Any) -> str | None:
    """The error text of a failed run (exception, timeout or crash of the runtime; the
    sandbox restarts a killed runtime itself and says so in the next result's stdout), None
    when the run succeeded."""
    if result.error or result.timed_out:
        return "Error: " + (result.error or "the code timed out").strip()
    return None


def _text_result(stdout: str, error: str | None) -> str:
    """The observation's text: what the code printed (trailing whitespace trimmed), then
    the error on its own line."""
    text = stdout.rstrip()
    if error is None:
        return text
    return f"{text}\n{error}" if text else error
