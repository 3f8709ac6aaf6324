"""The packaged SFT checkpoint of the four-kind toy (configs/kinds_cpu.py) keeps doing its job: on held-out
synthetic tasks (seed 4242, never trained on) it writes code, reads what the code printed
and answers right often enough. A smaller version of docs/learning.md's held-out evaluation, so
a change to the model, the episode, the sandbox or the checkpoint cannot silently break it."""

from configs.kinds_cpu import get_config
from pyvision_jax.data import synthetic
from pyvision_jax.wiring.evaluation import evaluate_checkpoint

PER_KIND, K = 3, 2
ACCEPT_ACCURACY, ACCEPT_TOOL_CALLS = 0.30, 0.75
"""Measured at packaging: accuracy 0.56, 1.06 tool calls, 17 of 18 rollouts DONE (a random
init scores 0 and 0); the margins absorb sampling differences across CPUs."""


def test_the_packaged_checkpoint_uses_its_tools_and_answers_heldout_tasks(tmp_path):
    config = get_config()
    tasks = synthetic.write_synthetic_task_file(tmp_path / "tasks", PER_KIND, config.eval.heldout_seed)
    results = evaluate_checkpoint(config, None, tasks, tmp_path / "eval", k=K, progress=False)
    assert results["num_rollouts"] == 3 * PER_KIND * K
    assert results["tool_calls"]["mean"] >= ACCEPT_TOOL_CALLS, results["tool_calls"]
    assert results["accuracy"] >= ACCEPT_ACCURACY, results["accuracy"]
    assert results["end_reasons"].get("DONE", 0) >= results["num_rollouts"] // 2, results["end_reasons"]
