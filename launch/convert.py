"""Thin wrapper over `pyvision-convert` (pyvision_jax.cli.convert), whose docstring it takes for --help."""

from pyvision_jax.cli.convert import __doc__, run  # noqa: F401 - absl's --help prints the main module's __doc__

if __name__ == "__main__":
    run()
