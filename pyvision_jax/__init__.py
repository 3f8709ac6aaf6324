"""pyvision_jax: the PyVision-RL recipe (agentic RL for Qwen2.5-VL) in JAX/Flax."""

__version__ = "0.1.0"
