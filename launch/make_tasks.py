"""Thin wrapper over `pyvision-make-tasks` (pyvision_jax.cli.make_tasks), whose docstring it takes for --help."""

from pyvision_jax.cli.make_tasks import __doc__, run  # noqa: F401 - absl's --help prints the main module's __doc__

if __name__ == "__main__":
    run()
