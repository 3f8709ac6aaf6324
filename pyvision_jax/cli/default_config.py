"""The config file a command uses when --config is not given: the embedded default."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = str(REPO_ROOT / "configs" / "tiny_cpu.py")
