"""The console commands (setup.py entry points): `pyvision-train`, `pyvision-eval`,
`pyvision-convert`, `pyvision-rollout-worker`, `pyvision-make-tasks`. Each module parses its
flags and hands the config to `pyvision_jax.wiring`; `launch/*.py` are thin wrappers over them."""
