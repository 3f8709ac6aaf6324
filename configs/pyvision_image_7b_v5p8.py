"""PyVision-Image on a 4-chip TPU v5p-8 slice: the 7B image recipe with a 4-way fsdp mesh.

    python launch/train.py --config configs/pyvision_image_7b_v5p8.py \
        --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct --workdir /runs/pyvision_image_7b_v5p8

Same recipe as configs/pyvision_image_7b.py; what changes is the hardware: 4 chips
(`mesh_fsdp=4`), one packed row of up to 32,768 tokens per chip per micro-batch
(`micro_batch=4`, so the batch takes twice as many micro-batches), and the Pallas splash
attention kernel. benchmarks/memory_7b.py --devices 4 measures its per-chip memory.
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

image_7b_config = sibling("pyvision_image_7b").get_config


def get_config() -> ml_collections.ConfigDict:
    c = image_7b_config()
    c.model.attention = "splash"  # Pallas TPU kernel; block sizes multiples of 128
    c.model.attention_block_q = 512
    c.model.attention_block_kv = 512
    c.train.micro_batch = 4
    c.train.mesh_data = 1
    c.train.mesh_fsdp = 4
    c.train.mesh_tensor = 1
    return c
