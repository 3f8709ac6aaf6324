"""The layout of a training run's directory (WORKDIR): the names the trainer writes and the
evaluation, the exporter and the config checks read, kept here so that they agree.

    WORKDIR/config.json                the resolved config (process 0)
    WORKDIR/checkpoints/<step>/state   the orbax TrainState (params, optimizer state)
    WORKDIR/checkpoints/<step>/cursors the source's and task order's state (JSON)
    WORKDIR/checkpoints_damaged/       unreadable checkpoints moved aside on restore
    WORKDIR/tb/                        TensorBoard (validation scalars in tb/validation)
    WORKDIR/trajectories.jsonl         a sample of each step's groups
    WORKDIR/validation/step_N/         evaluations during training
    WORKDIR/weights/                   published weight versions (the fleet's default)
    WORKDIR/inflight/                  fleet groups spooled until a checkpoint covers them
    WORKDIR/jax_cache/                 compiled XLA executables
    WORKDIR/.lock                      held by the one trainer of the workdir
"""

RESOLVED_CONFIG = "config.json"
CHECKPOINT_DIR = "checkpoints"
STATE_ITEM, CURSORS_ITEM = "state", "cursors"
QUARANTINE_DIR = "checkpoints_damaged"
TB_DIR = "tb"
TRAJECTORY_SAMPLE = "trajectories.jsonl"
VALIDATION_DIR = "validation"
WEIGHTS_DIR = "weights"
SPOOL_DIR = "inflight"
COMPILATION_CACHE_DIR = "jax_cache"
LOCK_FILE = ".lock"
