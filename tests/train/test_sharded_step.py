"""The sharded step on an 8-device CPU mesh equals the 1-device step (in a subprocess, since
the device count is fixed when JAX starts)."""

import os
import subprocess
import sys
from pathlib import Path

from tests.train.compilation_cache import COMPILATION_CACHE

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp_tensor_mesh_matches_one_device():
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
        JAX_COMPILATION_CACHE_DIR=COMPILATION_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
    )
    result = subprocess.run(
        [sys.executable, "-m", "tests.train.sharded_step_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SHARDED-OK" in result.stdout
