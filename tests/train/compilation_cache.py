"""The persistent XLA compilation cache the trainer tests and their subprocesses share."""

import os

COMPILATION_CACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pyvision_jax_test_xla_cache")
