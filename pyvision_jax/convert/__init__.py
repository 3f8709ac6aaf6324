"""Hugging Face safetensors <-> Flax parameter conversion."""
