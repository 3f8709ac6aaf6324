"""Write a synthetic task file and its media (the generator the trainer uses).

    python launch/make_tasks.py --out /tmp/tasks --per-kind 8 --seed 7 [--kinds visual_search,counting,video]

One JSONL file per kind (`DIR/<kind>.jsonl`, media beside it) plus `DIR/tasks.jsonl` with
every task, ready for `launch/eval.py --data`. Seeds used in training: data.synthetic_seed
(RL, default 0) and sft.synthetic_seed (SFT, default 1000); evaluate on another seed.
"""

from pyvision_jax.cli.make_tasks import run

if __name__ == "__main__":
    run()
