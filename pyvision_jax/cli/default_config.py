"""The config file a command uses when --config is not given: the embedded default."""

from pyvision_jax.data.config_files import CONFIGS_DIR

DEFAULT_CONFIG = str(CONFIGS_DIR / "tiny_cpu.py")
