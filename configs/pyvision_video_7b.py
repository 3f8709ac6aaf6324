"""PyVision-Video: the paper's recipe for video tasks on Qwen2.5-VL-7B (on-demand context:
the video lives only in the runtime; the model shows itself the frames it needs).

    python launch/train.py --config configs/pyvision_video_7b.py \
        --config.model.hf_dir=/models/Qwen2.5-VL-7B-Instruct \
        --config.data.train_files=/data/pyvision_video_train.jsonl \
        --config.rollout.redis_url=redis://queue-host:6379/0 --workdir /runs/pyvision_video_7b \
        --config.data.val_files=/data/video_val.jsonl  # validated every 20 steps and before training

Same optimisation recipe as configs/pyvision_image_7b.py (B = 16 from 32 prompts, G = 8,
4 tool calls, lr 1e-6, 700 steps, vLLM fleet over Redis, 8-device mesh).
"""

import ml_collections

from pyvision_jax.data.config_files import sibling

image_config = sibling("pyvision_image_7b").get_config


def get_config() -> ml_collections.ConfigDict:
    c = image_config()
    c.data.train_files = ()  # required: the video RL training set (rows with video_path)
    c.episode.max_images = 32  # frames the model may show itself per trajectory
    c.episode.image_max_pixels = 2_000_000
    return c
