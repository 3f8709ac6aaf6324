"""The project's config files: where they are, and how one config file reads another.

In a checkout they are `configs/` beside the package; an installed copy ships the same folder
as the package `pyvision_jax_configs`, a name no other project's `configs` can shadow. A
config file reads the files next to it by path (`sibling`), never by a package name, so the
folder works wherever it lies and under whatever name (`--config FILE` loads a file by path).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

INSTALLED_PACKAGE = "pyvision_jax_configs"
"""The configs' name in site-packages (setup.py's package_dir maps it to configs/)."""


def configs_dir(beside_package: Path) -> Path:
    """The folder of the project's configs, prompts and sandbox helpers, given the folder that
    holds pyvision_jax/: the installed package there (site-packages), else the checkout's configs/."""
    installed = beside_package / INSTALLED_PACKAGE
    return installed if installed.is_dir() else beside_package / "configs"


CONFIGS_DIR = configs_dir(Path(__file__).resolve().parents[2])


def sibling(name: str) -> ModuleType:
    """The module `name`.py of the folder holding the calling config file, loaded by path.

    The folder is that of the caller's code object, so it is right however the config file was
    loaded: imported, by ml_collections' `--config FILE`, or compiled and run with its path."""
    caller = Path(sys._getframe(1).f_code.co_filename)
    path = caller.resolve().parent / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{caller}: no config file {path} beside it")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
