"""A rollout worker of a fleet: generates scored trajectory groups into the trajectory queue.

    python launch/rollout_worker.py --config configs/tiny_cpu.py \
        --config.rollout.queue=redis --config.rollout.redis_url=redis://host:6379/0 \
        --worker-index 0 --num-workers 4 --workdir /shared/rollout

Worker I of N takes its shard of the training tasks (see pyvision_jax.data.task_order), runs
rl.group_size episodes per task with rollout.engine ("jax"; "vllm", run with
.venv-vllm/bin/python; or "scripted" with rollout.script_file, a JSON {task id or "*": [turn
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

from pyvision_jax.cli.rollout_worker import run

if __name__ == "__main__":
    run()
