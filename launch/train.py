"""Thin wrapper over `pyvision-train` (pyvision_jax.cli.train), whose docstring it takes for --help."""

from pyvision_jax.cli.train import __doc__, run  # noqa: F401 - absl's --help prints the main module's __doc__

if __name__ == "__main__":
    run()
