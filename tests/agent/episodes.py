"""Running one scripted episode against the fake sandbox pool, keeping what the engine saw."""

from pyvision_jax.agent.episode import EpisodeConfig
from pyvision_jax.agent.runner import EpisodeRunner
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from tests.agent.fake_sandbox import FakePool


class RecordingEngine(ScriptedEngine):
    """Keeps every request and result, in order, per request id."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests, self.results = {}, {}

    def generate(self, requests, params):
        results = super().generate(requests, params)
        for request, result in zip(requests, results):
            self.requests.setdefault(request.request_id, []).append(request)
            self.results.setdefault(request.request_id, []).append(result)
        return results


def run_one(tokenizer, task, turns, **config):
    """(trajectory, engine, pool) of `task` played with the scripted `turns` under `config`."""
    engine = RecordingEngine(tokenizer, {task.id: turns})
    pool = FakePool()
    runner = EpisodeRunner(engine, tokenizer, pool, EpisodeConfig(**config))
    (trajectory,) = runner.run_trajectories([(task, 0)])
    return trajectory, engine, pool
