"""Runs many episodes at once: batched generation through one engine, sandbox work on a pool.

Concurrency (``EpisodeRunner.stream``; ``run_trajectories`` is it over a fixed list). One
driver thread owns the engine; a thread pool owns all per-trajectory host work (loading media
and rendering the prompt, sandbox acquisition and runs, rendering observations, releasing
sandboxes). The driver loops:

1. admit new trajectories from the job feed up to ``max_concurrent`` in flight (their START
   job goes to the pool), so a finished episode's place is taken at once, whatever group
   either belongs to;
2. collect every job that has finished, without waiting, moving its trajectory to the ready
   list (or retiring it and yielding the trajectory);
3. hand every ready trajectory's turn to the engine: with a ``StreamingEngine`` each is
   submitted on its own (continuous batching in the engine: no turn waits for another's
   sequence), otherwise ``engine.generate`` runs once on ALL ready trajectories; each
   generated turn is parsed and its next step (tool run or finalization) goes to the pool;
4. only when nothing is ready, block until the first job finishes.

So generation is batched over whatever is ready, sandbox work of other trajectories proceeds
meanwhile, and no trajectory waits for a slow sandbox of another: there is no per-turn
barrier. Each trajectory has at most one job at a time and the pool has ``max_concurrent``
threads, so jobs never queue behind each other; a START or TOOL job may block on
``SandboxPool.acquire`` only while other trajectories hold sandboxes, and those release them
from their own threads, so the pool cannot deadlock.

The transitions of each trajectory are ``pyvision_jax.agent.episode.EpisodeMachine``'s.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from PIL import Image
from tqdm import tqdm

from pyvision_jax.agent.engine import Engine, SamplingParams, StreamingEngine
from pyvision_jax.agent.episode import CODE_STOP, EpisodeConfig, EpisodeMachine, EpisodeState, PendingAction, TaskPrompt
from pyvision_jax.agent.prompts import ChatRenderer
from pyvision_jax.agent.trajectory import Trajectory, TrajectoryGroup
from pyvision_jax.data.tasks import Task

logger = logging.getLogger(__name__)


class Abandoned(RuntimeError):
    """The run's stop event was set: episodes in flight were given up (their sandboxes
    released), none of them finished."""


class SandboxLike(Protocol):
    """What the runner uses of ``pyvision_jax.agent.sandbox.Sandbox``."""

    def run(self, code: str) -> Any: ...

    def preload_image(self, name: str, image: Image.Image) -> None: ...

    def preload_video(self, name: str, path: str) -> None: ...

    def preload_code(self, name: str, code: str) -> None: ...


class SandboxSource(Protocol):
    """What the runner uses of ``pyvision_jax.agent.sandbox.SandboxPool``."""

    def acquire(self, timeout_s: float | None = None) -> SandboxLike: ...

    def release(self, sandbox: SandboxLike) -> None: ...


@dataclass
class _SandboxedEpisode(EpisodeState):
    """An episode's state plus the sandbox it holds (acquired at its first code run) and its
    admission position in the runner's stream."""

    sandbox: SandboxLike | None = None
    position: int = -1


class JobFeed(Protocol):
    """Hands `EpisodeRunner.stream` its (task, rollout index) jobs as room frees up."""

    def take(self, room: int) -> list[tuple[Task, int]] | None:
        """At most `room` jobs to start now ([] when none just now), None when there are no more."""
        ...


class ListFeed:
    """A fixed list of jobs, handed out in order."""

    def __init__(self, jobs: Sequence[tuple[Task, int]]):
        self._jobs = deque(jobs)

    def take(self, room: int) -> list[tuple[Task, int]] | None:
        if not self._jobs:
            return None
        return [self._jobs.popleft() for _ in range(min(room, len(self._jobs)))]


class _PromptCache:
    """Renders each task's prompt once per run, whichever rollout asks first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[threading.Lock, list[TaskPrompt]]] = {}

    def get(self, task: Task, render: Callable[[Task], TaskPrompt]) -> TaskPrompt:
        with self._lock:
            lock, slot = self._entries.setdefault(task.id, (threading.Lock(), []))
        with lock:
            if not slot:
                slot.append(render(task))
            return slot[0]


class EpisodeRunner:
    """Runs episodes of tasks with one engine, one tokenizer and a sandbox pool."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        sandboxes: SandboxSource,
        config: EpisodeConfig = EpisodeConfig(),
        sampling: SamplingParams = SamplingParams(),
    ):
        self.engine = engine
        self.sandboxes = sandboxes
        self.config = config
        self.machine = EpisodeMachine(config, ChatRenderer(tokenizer, merge_size=config.merge_size))
        self.sampling = dataclasses.replace(
            sampling,
            stop=tuple(dict.fromkeys((*sampling.stop, CODE_STOP))),
            max_new_tokens=config.max_new_tokens_per_turn,
        )

    def run(self, tasks: Sequence[Task], group_size: int = 1, progress: bool = False) -> list[TrajectoryGroup]:
        """``group_size`` rollouts of every task, grouped per task in task order."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        jobs = [(task, k) for task in tasks for k in range(group_size)]
        trajectories = self.run_trajectories(jobs, progress=progress)
        return [
            TrajectoryGroup(task, tuple(trajectories[i * group_size : (i + 1) * group_size]))
            for i, task in enumerate(tasks)
        ]

    def run_trajectories(
        self, jobs: Sequence[tuple[Task, int]], progress: bool = False, stop: threading.Event | None = None
    ) -> list[Trajectory]:
        """One trajectory per (task, rollout index), in input order; raises `Abandoned` when
        `stop` is set first."""
        results: list[Trajectory | None] = [None] * len(jobs)
        with tqdm(total=len(jobs), desc="episodes", disable=not progress) as bar:
            for position, trajectory in self.stream(ListFeed(jobs), stop=stop):
                results[position] = trajectory
                bar.update(1)
        return [t for t in results if t is not None]

    def stream(
        self, feed: "JobFeed", poll_s: float = 0.5, stop: threading.Event | None = None
    ) -> Iterator[tuple[int, Trajectory]]:
        """(admission position, trajectory) of every job `feed` hands out, as each finishes.
        Setting `stop` abandons the episodes in flight (`Abandoned`) at the next turn
        boundary: no turn starts after it, and tool runs in progress end with their pool.

        The feed is asked for at most the free room (``max_concurrent`` minus the episodes in
        flight) whenever there is room, so new episodes start the moment others end; an empty
        answer pauses admission (asked again within ``poll_s``), None ends it. With a
        `StreamingEngine` each ready turn is submitted on its own; with any other engine the
        ready turns are batched into one ``generate`` call.
        """
        streaming = isinstance(self.engine, StreamingEngine)
        prompts = _PromptCache()
        episodes: dict[int, _SandboxedEpisode] = {}
        running: dict[futures.Future, tuple[str, _SandboxedEpisode]] = {}
        submitted: dict[int, float] = {}
        ready: list[_SandboxedEpisode] = []
        admitted, open_feed = 0, True
        pool = futures.ThreadPoolExecutor(self.config.max_concurrent, thread_name_prefix="episode")
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise Abandoned(f"stopped with {len(episodes)} episode(s) in flight")
                room = self.config.max_concurrent - len(running)
                jobs = feed.take(room) if open_feed and room > 0 else []
                if jobs is None:
                    open_feed, jobs = False, []
                for task, index in jobs[:room]:
                    episode = episodes[admitted] = _SandboxedEpisode(task, index)
                    episode.position = admitted
                    admitted += 1
                    running[pool.submit(self._start, episode, prompts)] = ("start", episode)
                if not running:
                    if not open_feed:
                        return
                    time.sleep(poll_s)
                    continue
                self._wait_for_work(running, timeout_s=poll_s if open_feed else None, gather=not streaming)
                for future in [f for f in running if f.done()]:
                    stage, episode = running.pop(future)
                    outcome = future.result()
                    if stage == "finish":
                        del episodes[episode.position]
                        yield episode.position, outcome
                    elif stage == "generate":
                        episode.generate_s += time.perf_counter() - submitted.pop(id(episode))
                        self._after_generation(episode, self.machine.after_generation(episode, outcome), running, pool)
                    elif episode.end_reason is None:
                        ready.append(episode)
                    else:
                        running[pool.submit(self._finish, episode)] = ("finish", episode)
                if ready and streaming:
                    for episode in ready:
                        submitted[id(episode)] = time.perf_counter()
                        request = self.machine.request(episode)
                        running[self.engine.submit(request, self.sampling)] = ("generate", episode)
                elif ready:
                    for episode, step in zip(ready, self._generate(ready)):
                        self._after_generation(episode, step, running, pool)
                ready = []
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            for episode in episodes.values():
                if episode.sandbox is not None:
                    self.sandboxes.release(episode.sandbox)
                    episode.sandbox = None
            raise
        finally:
            pool.shutdown(wait=True)

    # -- driver-thread steps -------------------------------------------------------------

    def _wait_for_work(
        self, running: dict[futures.Future, Any], timeout_s: float | None = None, gather: bool = True
    ) -> None:
        """Blocks until a job is done (or `timeout_s`), then, with `gather`, briefly lets
        near-simultaneous ones finish too (at most ``gather_s``) so they share one generation
        batch (a streaming engine batches by itself: no gathering)."""
        done, _ = futures.wait(list(running), timeout=timeout_s, return_when=futures.FIRST_COMPLETED)
        if gather and done and self.config.gather_s > 0:
            futures.wait(
                [f for f in running if not f.done()], timeout=self.config.gather_s, return_when=futures.ALL_COMPLETED
            )

    def _after_generation(
        self,
        episode: _SandboxedEpisode,
        step: PendingAction | None,
        running: dict[futures.Future, tuple[str, _SandboxedEpisode]],
        pool: futures.ThreadPoolExecutor,
    ) -> None:
        """Hands the episode's next step (its tool run, or its end) to the pool."""
        if step is None:
            running[pool.submit(self._finish, episode)] = ("finish", episode)
        else:
            running[pool.submit(self._tool, episode, step)] = ("tool", episode)

    def _generate(self, batch: list[_SandboxedEpisode]) -> list[PendingAction | None]:
        requests = [self.machine.request(e) for e in batch]
        start = time.perf_counter()
        outputs = self.engine.generate(requests, self.sampling)
        elapsed = time.perf_counter() - start
        if len(outputs) != len(batch):
            raise RuntimeError(f"engine returned {len(outputs)} results for {len(batch)} requests")
        steps = []
        for episode, output in zip(batch, outputs):
            episode.generate_s += elapsed
            steps.append(self.machine.after_generation(episode, output))
        return steps

    # -- pool-thread steps ---------------------------------------------------------------

    def _start(self, episode: _SandboxedEpisode, prompts: _PromptCache) -> None:
        episode.started_at = time.perf_counter()
        try:
            prompt = prompts.get(episode.task, self.machine.render_prompt)
        except Exception as err:  # noqa: BLE001 - unreadable media end this episode, not the run
            logger.warning(
                "task %s: its media could not be read (%s: %s); the episode ends broken",
                episode.task.id,
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
            )
            self.machine.fail_start(episode)
            return
        self.machine.begin(episode, prompt)

    def _tool(self, episode: _SandboxedEpisode, pending: PendingAction) -> None:
        """Runs the action's code (or shows its format feedback) and preloads the images
        the observation added into the sandbox."""
        if pending.action.kind.malformed:
            self.machine.show_feedback(episode, pending)
            return
        try:
            result = self._sandbox(episode).run(pending.action.code)
        except Exception as err:  # the sandbox's infrastructure, not the model's code
            self.machine.fail_run(episode, pending, err)
            return
        for name, image in self.machine.after_run(episode, pending, result):
            try:
                episode.sandbox.preload_image(name, image)
            except Exception as err:
                self.machine.fail_preload(episode, err)
                return

    def _sandbox(self, episode: _SandboxedEpisode) -> SandboxLike:
        """The episode's sandbox, acquired on first use with the clues preloaded."""
        if episode.sandbox is None:
            sandbox = self.sandboxes.acquire(timeout_s=self.config.sandbox_acquire_timeout_s)
            episode.sandbox = sandbox
            if episode.task.is_video:
                sandbox.preload_video("video_clue_0", episode.task.video_path)
            for name, image in episode.runtime_images.items():
                sandbox.preload_image(name, image)
            if self.config.setup_code:
                sandbox.preload_code("setup", self.config.setup_code)
        return episode.sandbox

    def _finish(self, episode: _SandboxedEpisode) -> Trajectory:
        if episode.sandbox is not None:
            sandbox, episode.sandbox = episode.sandbox, None
            self.sandboxes.release(sandbox)
        return self.machine.trajectory(episode, self.engine.version, time.perf_counter() - episode.started_at)
