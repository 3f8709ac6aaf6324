"""One process of a sync-mode training run for the multi-host test (scripted engine, fake
sandboxes, three colour tasks), on the devices XLA_FLAGS gives it:

    python -m tests.train.multihost_run WORKDIR STEPS [COORDINATOR NUM_PROCESSES PROCESS_ID]

With a coordinator it is one of NUM_PROCESSES `jax.distributed` processes. Process 0 prints
`ENGINE-WEIGHTS version sum` for the last params its engine received (host copies gathered
from every process's devices) and `GATHER-BLOCKS equal` when gathering the final params in
blocks of 4 KiB rows gives what one gather per leaf gives.
"""

import sys
from pathlib import Path

import numpy as np

from pyvision_jax import wiring
from pyvision_jax.rollout.scripted_engine import ScriptedEngine
from pyvision_jax.train.multihost import gather_to_host
from tests.agent.fake_sandbox import FakePool
from tests.train.scripted_runs import colour_tasks, small_config


class RecordingEngine(ScriptedEngine):
    """A scripted engine that remembers the sum of the last weights it was given."""

    received: tuple[int, float] | None = None

    def update_weights(self, weights, version: int) -> None:
        total = sum(float(np.asarray(leaf, np.float64).sum()) for leaf in _leaves(weights))
        self.received = (version, total)
        super().update_weights(weights, version)


def answers(request, turn: int) -> str:
    """Even rollouts answer A tersely, odd ones B at length: rewards and lengths vary in every
    group, so the loss is not zero."""
    rollout = int(request.request_id.rsplit("/", 1)[1])
    thought = "Looking." if rollout % 2 == 0 else "Looking closely at every corner of the square first."
    return f"{thought}\n<answer>\n\\boxed{{{'AB'[rollout % 2]}}}\n</answer>"


def _leaves(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    else:
        yield tree


def main(workdir: str, steps: str, coordinator: str = "", processes: str = "0", process_id: str = "-1") -> None:
    config = small_config(int(steps))
    config.rl.batch_groups, config.rl.group_size, config.rl.oversample = 2, 2, 1.0
    config.rl.max_gen_rounds = 1
    config.train.micro_batch = 4
    config.train.mesh_fsdp = -1
    config.train.checkpoint_every = 2
    config.train.distributed = bool(coordinator)
    config.train.coordinator_address = coordinator
    config.train.num_processes, config.train.process_id = int(processes), int(process_id)
    tasks_dir = Path(workdir) / f"tasks-{process_id}"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = wiring.load_tokenizer(config)
    engine = RecordingEngine(tokenizer, answers)
    trainer = wiring.build_trainer(
        config,
        workdir,
        tokenizer=tokenizer,
        engine=engine,
        sandboxes=FakePool(),
        tasks=colour_tasks(tasks_dir),
        progress=False,
        log=print,
    )
    summary = trainer.run()
    print(f"FINISHED {summary.first_step} {summary.last_step}", flush=True)
    if engine.received is not None:
        print(f"ENGINE-WEIGHTS {engine.received[0]} {engine.received[1]!r}", flush=True)
    whole, blocks = gather_to_host(trainer.state.params), gather_to_host(trainer.state.params, chunk_bytes=4096)
    if whole is not None:
        equal = all(np.array_equal(a, b) for a, b in zip(_leaves(whole), _leaves(blocks)))
        print(f"GATHER-BLOCKS {'equal' if equal else 'different'}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
