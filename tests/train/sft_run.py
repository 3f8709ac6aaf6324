"""One process of a small SFT run on a hand-made released-schema file (tiny model), for the
SFT resume and multi-process tests:

    python -m tests.train.sft_run WORKDIR SFT_FILE STEPS [KILL_AT_STEP [COORDINATOR NUM_PROCESSES PROCESS_ID]]

With KILL_AT_STEP > 0 the process SIGKILLs itself as soon as it has logged that step (its
metrics are written; its checkpoint is not), as a crash in the middle of a run would.
"""

import os
import signal
import sys

from configs.sft_tiny import get_config
from pyvision_jax import wiring


def sft_config(sft_file: str, steps: int):
    c = get_config()
    c.model.preset = "tiny"
    c.sft.train_files = (sft_file,)
    c.sft.batch_size = 4
    c.train.steps = steps
    c.train.micro_batch = 2
    c.train.length_buckets = (512,)
    c.train.checkpoint_every = 1
    c.train.lr = 3e-3
    c.train.warmup_steps = 0
    c.train.mesh_fsdp = -1
    return c


def main(
    workdir: str,
    sft_file: str,
    steps: str,
    kill_at: str = "0",
    coordinator: str = "",
    processes: str = "0",
    process_id: str = "-1",
) -> None:
    config = sft_config(sft_file, int(steps))
    config.train.distributed = bool(coordinator)
    config.train.coordinator_address = coordinator
    config.train.num_processes, config.train.process_id = int(processes), int(process_id)

    def log(line: str) -> None:
        print(line, flush=True)
        if int(kill_at) and line.startswith(f"step {kill_at}/"):
            os.kill(os.getpid(), signal.SIGKILL)

    summary = wiring.train_sft(config, workdir, progress=False, log=log)
    print(f"FINISHED {summary.first_step} {summary.last_step}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
