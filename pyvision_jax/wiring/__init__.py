"""The composition root: config -> typed settings and built objects, and the jobs that run
on them (GRPO, SFT, evaluation, held-out before/after, the fleet's rollout workers). Each
module owns one concern:

- `config_values`: tuples of the config checked, with the field in the error.
- `model`: checkpoint directory, tokenizer, architecture, initial params.
- `tasks`: training tasks and their order's seed.
- `episodes`: episode budgets and prompts, scorer routes and the judge, sandbox pool, sampling.
- `engines`: the JAX engine, vLLM and the directory vLLM loads.
- `rollouts`: queue, producer, the trainer's group source, the fleet worker.
- `settings`: the typed settings of the training loops and of held-out evaluation.
- `training`: GRPO and SFT runs.
- `evaluation`: evaluating a checkpoint on a task file.
- `export`: a training checkpoint as a Hugging Face directory (`pyvision-convert flax2hf`).
- `heldout`: held-out accuracy before and after training.
- `compilation_cache`: JAX's persistent compilation cache in the workdir.
- `code_generation`: the LLVM optimization level XLA compiles the run's executables with.

`train/` and `eval/` never read a ConfigDict; `pyvision_jax.cli` is the only layer above in the
package; the learning experiments (`experiments/`, outside it) build their runs on this one.
"""

from pyvision_jax.wiring.code_generation import use_backend_optimization_level
from pyvision_jax.wiring.compilation_cache import COMPILATION_CACHE_DIR, use_compilation_cache
from pyvision_jax.wiring.config_values import int_tuple, str_tuple
from pyvision_jax.wiring.engines import jax_engine, require_vllm, vllm_engine, vllm_model_dir
from pyvision_jax.wiring.episodes import episode_config, sampling_params, sandbox_pool, scorer_routes
from pyvision_jax.wiring.evaluation import evaluate_checkpoint
from pyvision_jax.wiring.heldout import evaluate_heldout, train_with_heldout
from pyvision_jax.wiring.model import (
    ASSETS_DIR,
    PACKAGED_PREFIX,
    attention_config,
    hf_dir,
    load_model,
    load_tokenizer,
    model_config,
    param_shapes,
    tokenizer_dir,
)
from pyvision_jax.wiring.rollouts import (
    MODES,
    SPOOL_DIR,
    TRAINER_CONSUMER,
    WEIGHTS_DIR,
    fleet_worker,
    group_source,
    producer,
    prompts_per_round,
    queue_config,
    trajectory_queue,
)
from pyvision_jax.wiring.settings import (
    export_dir,
    frozen_prefixes,
    grpo_settings,
    heldout_config,
    loss_config,
    optimizer_config,
    run_settings,
    selection_config,
    sft_settings,
    step_config,
)
from pyvision_jax.wiring.tasks import TASKS_DIR, task_file, task_order_seed, training_tasks
from pyvision_jax.wiring.training import build_trainer, sft_samples, train, train_sft

__all__ = [
    "ASSETS_DIR",
    "COMPILATION_CACHE_DIR",
    "MODES",
    "PACKAGED_PREFIX",
    "SPOOL_DIR",
    "TASKS_DIR",
    "TRAINER_CONSUMER",
    "WEIGHTS_DIR",
    "attention_config",
    "build_trainer",
    "episode_config",
    "evaluate_checkpoint",
    "evaluate_heldout",
    "export_dir",
    "fleet_worker",
    "frozen_prefixes",
    "group_source",
    "grpo_settings",
    "heldout_config",
    "hf_dir",
    "int_tuple",
    "jax_engine",
    "load_model",
    "load_tokenizer",
    "loss_config",
    "model_config",
    "optimizer_config",
    "param_shapes",
    "producer",
    "prompts_per_round",
    "queue_config",
    "require_vllm",
    "run_settings",
    "sampling_params",
    "sandbox_pool",
    "scorer_routes",
    "selection_config",
    "sft_samples",
    "sft_settings",
    "step_config",
    "str_tuple",
    "task_file",
    "task_order_seed",
    "tokenizer_dir",
    "train",
    "train_sft",
    "train_with_heldout",
    "training_tasks",
    "trajectory_queue",
    "use_backend_optimization_level",
    "use_compilation_cache",
    "vllm_engine",
    "vllm_model_dir",
]
