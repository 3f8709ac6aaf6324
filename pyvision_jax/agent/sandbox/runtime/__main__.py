"""Starts a runtime, `python -I -B <this file> <settings as JSON>`, or a pool's template,
`python -I -B <this file> --template <settings as JSON>`, inside the sandbox.

Run as a script, it loads its own directory as the package `pyvision_sandbox_runtime` (the
sandbox has no `pyvision_jax` to import it from) and runs that package's `main` (or
`template`).
"""

import importlib
import importlib.util
import os
import sys
import types

PACKAGE_NAME = "pyvision_sandbox_runtime"


def load_package(directory: str) -> types.ModuleType:
    """Imports the package in `directory` under PACKAGE_NAME, whatever the directory's name."""
    spec = importlib.util.spec_from_file_location(
        PACKAGE_NAME, os.path.join(directory, "__init__.py"), submodule_search_locations=[directory]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_NAME] = package
    spec.loader.exec_module(package)
    return package


if __name__ == "__main__":
    load_package(os.path.dirname(os.path.abspath(__file__)))
    protocol = importlib.import_module(f"{PACKAGE_NAME}.protocol")
    entry = "template" if sys.argv[1:2] == [protocol.TEMPLATE_FLAG] else "main"
    sys.exit(importlib.import_module(f"{PACKAGE_NAME}.{entry}").main(sys.argv))
