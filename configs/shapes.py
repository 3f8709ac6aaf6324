"""What every config of the "shapes" toy shares (data.shape_tasks: mode selection): the task
kind, its prompt and sandbox helpers, the small model with the tiny tokenizer, and the short
episode budgets its plans need."""

from pathlib import Path

import ml_collections

HERE = Path(__file__).resolve().parent


def apply(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`c` set up for the shapes tasks (in place); returns it."""
    c.model.preset = "small"
    c.model.tokenizer = "tiny"
    c.data.synthetic_kinds = ("shapes",)
    c.episode.image_prompt_file = str(HERE / "prompts" / "shapes_image.txt")
    c.sandbox.setup_file = str(HERE / "sandbox" / "shape_tools.py")
    c.episode.max_new_tokens_per_turn = 48
    c.episode.max_total_tokens = 512
    c.eval.max_new_tokens_per_turn = 48
    c.eval.max_total_tokens = 512
    c.eval.max_tool_calls = 4
    c.rollout.length_buckets = (256, 512)
    c.train.length_buckets = (512,)
    return c
