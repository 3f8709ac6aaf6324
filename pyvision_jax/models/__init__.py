"""Qwen2.5-VL in Flax NNX: vision tower, text decoder, M-RoPE position ids, sharding rules."""
