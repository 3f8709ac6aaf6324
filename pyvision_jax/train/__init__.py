"""The sharded GRPO trainer.

Modules: mesh (device mesh from config), state (TrainState, AdamW with a frozen vision tower),
step (chunked-logprob jitted train step with exact micro-batch accumulation), batching
(trajectories -> padded TrainBatch on the host), groups (scoring, oversample-filter-rank,
advantages), checkpoint (orbax CheckpointManager), trainer (the loop; `train(config, workdir)`).
Its TensorBoard scalars and resumable outputs are written through `run_logs`.
"""
