"""The packaged SFT checkpoint of the shapes toy (the embedded default's model) keeps the
properties the learning results rest on: sampled at temperature 1 on held-out tasks (seed
4242, never trained on) it mostly plays the quick plan, sometimes the careful one and sometimes
guesses; the careful plan beats the quick one on hard tasks; and its accuracy stays in its band.
A smaller version of docs/learning.md's evaluation, so a change to the model, the episode, the
sandbox helpers or the checkpoint cannot silently break the toy."""

import json
from collections import Counter

from configs.tiny_cpu import get_config
from pyvision_jax.data import synthetic
from pyvision_jax.data.shape_plans import plan_of
from pyvision_jax.eval.records import TRAJECTORIES_FILE
from pyvision_jax.wiring.evaluation import evaluate_checkpoint

TASKS, K = 16, 4
ACCURACY_BAND = (0.25, 0.85)
"""Measured at packaging on 48 tasks x 4 of seed 777 at temperature 1: accuracy 0.646; plans quick
0.57, careful 0.27, guess 0.16; the careful plan right on 0.87 of hard tasks, the quick one on
0.42. A random init scores 0. The bands absorb sampling differences across CPUs."""


def test_the_packaged_shapes_checkpoint_keeps_its_plan_shares_and_accuracy(tmp_path):
    config = get_config()
    tasks = synthetic.write_synthetic_task_file(tmp_path / "tasks", TASKS, config.eval.heldout_seed, ("shapes",))
    results = evaluate_checkpoint(config, None, tasks, tmp_path / "eval", k=K, progress=False)
    assert results["num_rollouts"] == TASKS * K
    assert ACCURACY_BAND[0] <= results["accuracy"] <= ACCURACY_BAND[1], results["accuracy"]
    records = [json.loads(line) for line in (tmp_path / "eval" / TRAJECTORIES_FILE).read_text().splitlines()]
    plans = Counter(plan_of("\n".join(turn["text"] for turn in r["turns"])) for r in records)
    share = {plan: plans[plan] / len(records) for plan in ("quick", "careful", "guess", "other")}
    assert share["quick"] >= 0.35 and share["quick"] > share["careful"], share
    assert 0.10 <= share["careful"] <= 0.50 and 0.03 <= share["guess"] <= 0.35, share
    assert share["other"] <= 0.10, share
    hard = [r for r in records if r["task"]["ability"].startswith("shapes_hard")]
    by_plan = {p: [r["correct"] for r in hard if plan_of("\n".join(t["text"] for t in r["turns"])) == p] for p in plans}
    assert sum(by_plan["careful"]) / max(len(by_plan["careful"]), 1) > sum(by_plan["quick"]) / len(by_plan["quick"])
