"""A rollout worker of a fleet: generates scored trajectory groups into the trajectory queue.

    pyvision-rollout-worker --config configs/tiny_cpu.py \
        --config.rollout.queue=redis --config.rollout.redis_url=redis://host:6379/0 \
        --worker-index 0 --num-workers 4 --workdir /shared/rollout

Worker I of N takes its shard of the training tasks (see pyvision_jax.data.task_order), runs
rl.group_size episodes per task with rollout.engine ("jax"; "vllm", run with
.venv-vllm/bin/pyvision-rollout-worker; or "scripted" with rollout.script_file, a JSON {task id or "*": [turn
texts]} for dry runs and tests) and loads the weights the trainer announces on the queue.
vLLM starts from model.hf_dir, else from the newest complete version the trainer published
(rollout.weights_dir, else the one announced on the queue), and takes each new version's
safetensors as they are. With rollout.worker_stream (the default) episodes of many groups
run at once (episode.max_concurrent, batched by vLLM up to rollout.max_batch sequences) and
each group is put as it ends; docs/fleet.md "Keeping vLLM busy". Its cursor (the end of the
finished prefix of its shard) is kept in WORKDIR/worker-I-of-N.json, so a restarted worker
continues where it stopped. SIGTERM finishes the groups in flight and exits; a second SIGTERM
abandons them.

Worker config keys: rollout.script_file, rollout.max_epochs (0: run until stopped),
rollout.poll_s, rollout.queue_namespace (the trainer's), rollout.worker_stream.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from pyvision_jax import wiring
from pyvision_jax.cli.default_config import DEFAULT_CONFIG
from pyvision_jax.cli.entry import run_command
from pyvision_jax.cli.user_errors import bad_input_exits, failed_writes_exit
from pyvision_jax.wiring.validation import startup_notices, validate_worker

PROGRAM = "pyvision-rollout-worker"
_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Config file.", lock_config=True)
_INDEX = flags.DEFINE_integer("worker-index", 0, "This worker's index in [0, num-workers).")
_COUNT = flags.DEFINE_integer("num-workers", 1, "Workers sharing the tasks.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the cursor (and synthetic tasks).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    logging.set_verbosity(logging.INFO)
    worker_holder: dict[str, Any] = {}
    terms = []

    def on_sigterm(signum: int, frame: Any) -> None:
        terms.append(signum)
        if len(terms) > 1:
            raise KeyboardInterrupt("second SIGTERM: abandoning the current group")
        if "worker" in worker_holder:
            worker_holder["worker"].request_stop()

    signal.signal(signal.SIGTERM, on_sigterm)  # before the sandbox pool installs its own
    config = _CONFIG.value
    with bad_input_exits(PROGRAM):
        validate_worker(config, _INDEX.value)
    for notice in startup_notices(config):
        logging.warning("%s", notice)
    workdir = Path(_WORKDIR.value).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    with bad_input_exits(PROGRAM):  # an unreachable server or refused credentials: one line
        queue = wiring.trajectory_queue(config, max_staleness=None)
    sandboxes = wiring.sandbox_pool(config)
    try:
        with bad_input_exits(PROGRAM):  # building reads the model, the script and the task files
            worker = wiring.fleet_worker(
                config,
                workdir,
                _INDEX.value,
                _COUNT.value,
                sandboxes=sandboxes,
                queue=queue,
                log=lambda line: logging.info("%s", line),
            )
        worker_holder["worker"] = worker
        if terms:
            worker.request_stop()
        with failed_writes_exit(PROGRAM):  # a cursor that cannot be written (a full disk): one line
            summary = worker.run()
    finally:
        sandboxes.close()
        queue.close()
    state = "stopped" if summary.stopped else "finished"
    print(
        f"rollout worker {_INDEX.value}/{_COUNT.value} {state}: {len(summary.produced)} groups "
        f"put, cursor {summary.cursor}, weights loaded {list(summary.versions_loaded)}, "
        f"{summary.pauses} pauses",
        flush=True,
    )


def run() -> None:
    """The `pyvision-rollout-worker` console command."""
    run_command(__name__, main)
