"""The sharded GRPO trainer."""
