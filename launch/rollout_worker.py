"""Thin wrapper over `pyvision-rollout-worker` (pyvision_jax.cli.rollout_worker), whose docstring is its --help."""

from pyvision_jax.cli.rollout_worker import __doc__, run  # noqa: F401 - absl's --help prints the main module's __doc__

if __name__ == "__main__":
    run()
