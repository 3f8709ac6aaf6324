"""Off-policy proxy for "does an RL update generalise?", in minutes instead of a training run.

    python -m benchmarks.update_proxy --workdir /tmp/proxy [--per-kind 8 --steps 9] \
        --setting lr=1e-4 --setting lr=3e-4,entropy_coef=-10 --setting lr=1e-3,eps=1e-4,negative_weight=0.1

The starting model (configs/kinds_cpu.py: the packaged SFT checkpoint) samples two pools of
groups of `rl.group_size` rollouts once (cached under WORKDIR): pool A on training tasks
(synthetic seed `--train-seed`) and pool B on tasks of another seed (`--proxy-seed`; never the
held-out evaluation seed 4242). Each setting then trains from the start on pool A, 4 groups a
step chosen from 8 by the recipe's selection (like a training run, but on fixed rollouts), and
every 3 steps scores pool B's rollouts under the new policy:

- d+ / d-: the mean change of the sequence log-probability of B's correct / wrong rollouts.
  A generalising update raises d+ and lowers d-; both falling far means the policy drifts off
  its own samples (the malformed code of the failed runs).
- tool: the share of B's rollouts that call a tool, estimated the same way as acc.
- acc: the new policy's accuracy on B's tasks estimated with per-group self-normalised
  importance weights exp(d) (exact for small moves; limited to the 4 sampled rollouts a task).

Settings are comma-separated key=value over: lr, eps (Adam), negative_weight, entropy_coef,
min_entropy (policy gradient only on tokens of at least that entropy), norm_lr and rest_lr
(factors on the updates of the final norm's scale and of every other parameter:
`train.lr_multipliers`; the norm's scale sets the temperature of every next-token
distribution at once, and rest_lr=0 trains it alone), uniform_norm (1: the norm's scale moves
all its entries by one shared amount, `train.uniform_updates`: a trained temperature),
seq_mean (1: `rl.loss_agg="seq-mean-token-mean"`, each rollout weighted alike; 0: the recipe's
token-mean). `--hf-dir` starts from another HF checkpoint than the config's.
Prints a table and writes WORKDIR/proxy.json.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import threading
from pathlib import Path

import jax
import numpy as np

from configs.kinds_cpu import get_config
from pyvision_jax import wiring
from pyvision_jax.models import param_logical_axes
from pyvision_jax.rl.losses import PPOLossConfig
from pyvision_jax.train.batch_placement import shard_batch
from pyvision_jax.train.batching import BatchingConfig, BatchShape, pack_batch
from pyvision_jax.train.groups import SelectionConfig, pool_arrays, select_rows
from pyvision_jax.train.mesh import make_mesh
from pyvision_jax.train.state import OptimizerConfig, init_train_state, make_optimizer, state_shardings
from pyvision_jax.train.step import StepConfig, make_train_step, micro_batch_logprobs

ROOT = Path(__file__).resolve().parents[1]

KEYS = {
    "lr": 1e-4,
    "eps": 1e-8,
    "negative_weight": 1.0,
    "entropy_coef": 0.0,
    "seq_mean": 0.0,
    "min_entropy": 0.0,
    "norm_lr": 1.0,
    "rest_lr": 1.0,
    "uniform_norm": 0.0,
}
GROUPS_PER_STEP, DRAWN_PER_STEP, EVAL_EVERY = 4, 8, 3


def parse_setting(text: str) -> dict[str, float]:
    setting = dict(KEYS)
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in KEYS:
            raise SystemExit(f"--setting {text!r}: unknown key {key!r}; known: {sorted(KEYS)}")
        setting[key] = float(value)
    return setting


def sample_pool(config, workdir: Path, name: str, seed: int, per_kind: int, model, params, tokenizer) -> list:
    """`per_kind` x 3 groups from the starting model on synthetic tasks of `seed` (cached)."""
    path = workdir / f"pool_{name}_seed{seed}_{per_kind}.pkl"
    if path.is_file():
        return pickle.loads(path.read_bytes())
    c = config.copy_and_resolve_references()
    c.data.synthetic_per_kind, c.data.synthetic_seed = per_kind, seed
    source = wiring.group_source(c, workdir / f"tasks_{name}_{seed}", model, params, tokenizer)
    source.start(params, 0, {})
    try:
        groups = source.collect(per_kind * len(c.data.synthetic_kinds), threading.Event())
    finally:
        source.close()
    path.write_bytes(pickle.dumps(groups))
    return groups


class PoolScorer:
    """Sequence log-probabilities of every rollout of a pool under given params."""

    def __init__(self, model, groups, batching: BatchingConfig):
        self.model = model
        self.rows = [t for g in groups for t in g.trajectories]
        index = np.arange(1, len(self.rows) + 1, dtype=np.float32)  # the advantage slot carries the row index
        self.batch, _ = pack_batch(model, self.rows, index, batching)
        self.correct = np.array([c for g in groups for c in g.scores.correct], float)
        self.tooled = np.array([t.num_tool_calls > 0 for t in self.rows], float)
        self.group = np.array([p for p, g in enumerate(groups) for _ in g.trajectories])
        self.logprobs = jax.jit(micro_batch_logprobs, static_argnums=(0, 1))
        self.step_config = StepConfig()

    def sequence_logprobs(self, params) -> np.ndarray:
        out = np.zeros(len(self.rows))
        for m in range(self.batch.num_micro_batches):
            micro = jax.tree.map(lambda x, m=m: x[m], self.batch)
            logprobs = np.asarray(self.logprobs(self.model, self.step_config, params, micro)[0])
            mask = np.asarray(micro.loss_mask & micro.attention_mask)
            segments, slots = np.asarray(micro.segment_ids), np.asarray(micro.advantages)
            for r, k in zip(*np.nonzero(slots)):
                out[int(slots[r, k]) - 1] = logprobs[r][mask[r] & (segments[r] == k + 1)].sum()
        return out

    def estimate(self, shift: np.ndarray) -> dict[str, float]:
        accuracies, tooled = [], []
        for p in np.unique(self.group):
            member = self.group == p
            weights = np.exp(shift[member] - shift[member].max())
            weights /= weights.sum()
            accuracies.append(float((weights * self.correct[member]).sum()))
            tooled.append(float((weights * self.tooled[member]).sum()))
        return {
            "acc": float(np.mean(accuracies)),
            "tool": float(np.mean(tooled)),
            "d+": float(shift[self.correct > 0].mean()),
            "d-": float(shift[self.correct == 0].mean()),
        }


def run_setting(
    setting, model, params, pool_a, scorer: PoolScorer, base: np.ndarray, steps: int, batching: BatchingConfig
) -> list[dict[str, float]]:
    multipliers = (("model/norm/scale", setting["norm_lr"]), (".*", setting["rest_lr"]))
    uniform = ("model/norm/scale",) if setting["uniform_norm"] else ()
    optimizer = make_optimizer(
        OptimizerConfig(lr=setting["lr"], eps=setting["eps"], lr_multipliers=multipliers, uniform_updates=uniform)
    )
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    state = init_train_state(params, optimizer, seed=0)
    shardings = state_shardings(state, param_logical_axes(model), mesh)
    state = jax.device_put(state, shardings)
    aggregation = "seq-mean-token-mean" if setting["seq_mean"] else "token-mean"
    step_config = StepConfig(
        loss=PPOLossConfig(
            entropy_coef=setting["entropy_coef"], aggregation=aggregation, min_entropy=setting["min_entropy"]
        )
    )
    train_step = make_train_step(model, step_config, optimizer, mesh, shardings, donate=False)
    selection = SelectionConfig(batch_groups=GROUPS_PER_STEP, negative_weight=setting["negative_weight"])
    floor, points = BatchShape(), []
    for step in range(steps):
        drawn = [pool_a[(step * GROUPS_PER_STEP + i) % len(pool_a)] for i in range(DRAWN_PER_STEP)]
        selected = select_rows(pool_arrays(drawn, DRAWN_PER_STEP, len(drawn[0])), selection)
        batch, stats = pack_batch(model, selected.rows, selected.advantages, batching, floor)
        floor = floor.cover(stats.shape)
        state, _ = train_step(state, shard_batch(batch, mesh))
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
            point = scorer.estimate(scorer.sequence_logprobs(state.params) - base)
            points.append({"step": step + 1, **point})
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--setting", action="append", default=[], help="key=value,... (repeatable)")
    parser.add_argument("--per-kind", type=int, default=8, help="tasks per kind in each pool")
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--proxy-seed", type=int, default=31337)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--hf-dir", default="", help="starting checkpoint (default: the config's model.hf_dir)")
    args = parser.parse_args()
    config = get_config()
    if args.hf_dir:
        config.model.hf_dir = args.hf_dir
    if args.proxy_seed == config.eval.heldout_seed:
        raise SystemExit(f"--proxy-seed {args.proxy_seed} is the held-out evaluation seed: pick another")
    settings = [parse_setting(s) for s in args.setting] or [dict(KEYS)]
    config.episode.max_concurrent, config.rollout.max_batch, config.sandbox.pool_size = 32, 32, 4
    workdir = Path(args.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    model, params = wiring.load_model(config)
    tokenizer = wiring.load_tokenizer(config)
    pool_a = sample_pool(config, workdir, "A", args.train_seed, args.per_kind, model, params, tokenizer)
    pool_b = sample_pool(config, workdir, "B", args.proxy_seed, args.per_kind, model, params, tokenizer)
    batching = BatchingConfig(tuple(config.train.length_buckets), config.train.micro_batch, pack=True)
    scorer = PoolScorer(model, pool_b, batching)
    base = scorer.sequence_logprobs(params)
    print(
        f"pool A: {len(pool_a)} groups (seed {args.train_seed}); pool B: {len(pool_b)} groups "
        f"(seed {args.proxy_seed}), accuracy {scorer.correct.mean():.3f}",
        flush=True,
    )
    results = []
    for setting in settings:
        points = run_setting(setting, model, params, pool_a, scorer, base, args.steps, batching)
        results.append({"setting": setting, "points": points})
        cells = " | ".join(
            f"s{p['step']}: acc {p['acc']:.3f} tool {p['tool']:.2f} d+ {p['d+']:+.2f} d- {p['d-']:+.2f}" for p in points
        )
        print(", ".join(f"{k} {v:g}" for k, v in setting.items()) + ": " + cells, flush=True)
    (workdir / "proxy.json").write_text(
        json.dumps(
            {"command": " ".join(sys.argv), "pool_b_accuracy": float(scorer.correct.mean()), "results": results},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
