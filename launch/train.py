"""Train a Qwen2.5-VL agent with the PyVision-RL recipe: GRPO, or SFT (`algorithm="sft"`).

    python launch/train.py --config configs/tiny_cpu.py --workdir /tmp/pyvision_tiny
    python launch/train.py --config configs/pyvision_image_7b.py \
        --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct --workdir /runs/image7b
    python launch/train.py --config configs/sft_tiny.py --workdir /tmp/sft_tiny

The workdir holds checkpoints/, tb/ (TensorBoard), trajectories.jsonl (a sample),
config.json (the resolved config) and jax_cache/ (compiled XLA executables; unless
JAX_COMPILATION_CACHE_DIR names another place). Rerunning with the same workdir resumes from
the latest checkpoint. SIGTERM saves a checkpoint and exits. With `eval.heldout_per_kind` > 0 the model
is evaluated on held-out synthetic tasks before and after training (WORKDIR/heldout/).
"""

from pyvision_jax.cli.train import run

if __name__ == "__main__":
    run()
