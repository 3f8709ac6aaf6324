"""Where a `TrainBatch` lives on the mesh: rows split over ("data", "fsdp") where they divide,
vision arrays replicated (the tower shards its windows itself, see models/vision.py)."""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pyvision_jax.models.sharding import batch_sharding
from pyvision_jax.train.step import TrainBatch


def batch_shardings(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
    """The sharding of each of `batch`'s arrays (the module docstring says which)."""
    rows = batch.input_ids.shape[1]
    replicated = NamedSharding(mesh, PartitionSpec())

    def rowwise(x: jax.Array, axis: int) -> NamedSharding:
        return batch_sharding(mesh, x.ndim, batch_axis=axis, batch_size=rows)

    return TrainBatch(
        input_ids=rowwise(batch.input_ids, 1),
        attention_mask=rowwise(batch.attention_mask, 1),
        positions=rowwise(batch.positions, 2),
        loss_mask=rowwise(batch.loss_mask, 1),
        behaviour_logprobs=rowwise(batch.behaviour_logprobs, 1),
        advantages=rowwise(batch.advantages, 1),
        pixel_values=None if batch.pixel_values is None else replicated,
        layout=None if batch.layout is None else jax.tree.map(lambda _: replicated, batch.layout),
        segment_ids=None if batch.segment_ids is None else rowwise(batch.segment_ids, 1),
        unit_tokens=None if batch.unit_tokens is None else rowwise(batch.unit_tokens, 1),
        unit_share=None if batch.unit_share is None else rowwise(batch.unit_share, 1),
        proximal_logprobs=None if batch.proximal_logprobs is None else rowwise(batch.proximal_logprobs, 1),
        reference_logprobs=None if batch.reference_logprobs is None else rowwise(batch.reference_logprobs, 1),
    )


def shard_batch(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
    """Places a host batch on the mesh."""
    return jax.device_put(batch, batch_shardings(batch, mesh))
