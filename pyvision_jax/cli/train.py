"""Train a Qwen2.5-VL agent with the PyVision-RL recipe: GRPO, or SFT (`algorithm="sft"`).

    pyvision-train --config configs/tiny_cpu.py --workdir /tmp/pyvision_tiny
    pyvision-train --config configs/pyvision_image_7b.py \
        --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct --workdir /runs/image7b
    pyvision-train --config configs/sft_tiny.py --workdir /tmp/sft_tiny

The workdir holds checkpoints/, tb/ (TensorBoard), trajectories.jsonl (a sample),
config.json (the resolved config) and jax_cache/ (compiled XLA executables; unless
JAX_COMPILATION_CACHE_DIR names another place). Rerunning with the same workdir resumes from
the latest checkpoint. SIGTERM saves a checkpoint and exits. With `eval.heldout_per_kind` > 0 the model
is evaluated on held-out synthetic tasks before and after training (WORKDIR/heldout/).
"""

from __future__ import annotations

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from pyvision_jax import wiring
from pyvision_jax.cli.default_config import DEFAULT_CONFIG
from pyvision_jax.cli.entry import run_command
from pyvision_jax.cli.user_errors import bad_input_exits, failed_writes_exit
from pyvision_jax.train.workdir_lock import WorkdirLock
from pyvision_jax.wiring.validation import startup_notices, validate_run

PROGRAM = "pyvision-train"
ALGORITHMS = {"grpo": wiring.train, "sft": wiring.train_sft}

_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Training config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, TensorBoard logs, samples).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar over steps.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    logging.set_verbosity(logging.WARNING)
    config, workdir = _CONFIG.value, _WORKDIR.value
    with bad_input_exits(PROGRAM):
        validate_run(config, workdir)
        not_applied = wiring.use_backend_optimization_level(config.train.xla_backend_optimization_level)
    for notice in startup_notices(config) + ([not_applied] if not_applied else []):
        print(notice, flush=True)
    # Taken before the held-out evaluation, so a second trainer is refused at once; in a
    # multi-host run process 0 takes it when training starts (its index is known then).
    lock = None if config.train.get("distributed", False) else WorkdirLock(workdir)
    with failed_writes_exit(PROGRAM):
        if lock is not None:
            lock.acquire()
        try:
            wiring.use_compilation_cache(workdir)
            summary, _ = wiring.train_with_heldout(
                config, workdir, ALGORITHMS[config.algorithm], progress=_PROGRESS.value
            )
        finally:
            if lock is not None:
                lock.release()
    if jax.process_index() != 0:
        return
    state = "interrupted at" if summary.interrupted else "finished at"
    print(f"training {state} step {summary.last_step} (started at step {summary.first_step})")
    print(f"TensorBoard logs: {summary.tensorboard_dir}  (tensorboard --logdir {summary.tensorboard_dir})")
    print(f"checkpoints:      {summary.checkpoint_dir}")
    if config.algorithm == "grpo" and config.data.val_files:
        print(f"validation:       {summary.workdir}/validation (TensorBoard: {summary.tensorboard_dir}/validation)")
    print(f"trajectory sample and resolved config: {summary.workdir}")


def run() -> None:
    """The `pyvision-train` console command."""
    run_command(__name__, main)
