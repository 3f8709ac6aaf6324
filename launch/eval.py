"""Evaluate a checkpoint on a task file: k rollouts per task, scored, with an HTML report.

    # the config's own model (configs/tiny_cpu.py: the packaged SFT checkpoint)
    python launch/eval.py --config configs/tiny_cpu.py --data /tmp/tasks/counting.jsonl --k 4 --out /tmp/ev

    # an HF checkpoint (config.json + safetensors; its tokenizer files are used)
    python launch/eval.py --config configs/pyvision_image_7b.py \
        --checkpoint /models/PyVision-Image-7B --data /data/vstar.jsonl --k 32 --out /runs/eval_vstar

    # a training checkpoint (the trainer's workdir, its checkpoints/ dir or one step dir)
    python launch/eval.py --config configs/tiny_cpu.py --checkpoint /tmp/pyvision_tiny \
        --data /tmp/pyvision_tiny/tasks/counting.jsonl --k 4 --out /tmp/pyvision_tiny_eval

A params checkpoint written by ``launch/convert.py hf2flax`` works the same way. The output
directory gets results.json, trajectories.jsonl and report.html; rerunning the same command
skips the tasks already finished there. Override any config field with --config.x=y, e.g.
--config.rollout.max_batch=16 --config.eval.temperature=0.6.
"""

from pyvision_jax.cli.eval import run

if __name__ == "__main__":
    run()
