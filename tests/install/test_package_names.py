"""The installed distribution claims no generic top-level name: its packages are pyvision_jax
and pyvision_jax_configs (the repository's configs/, renamed in the wheel), and an installed
copy without the repository finds its packaged configs, prompts and sandbox helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import setuptools

from pyvision_jax.data.config_files import INSTALLED_PACKAGE, configs_dir
from tests.install.test_requirements import matrix

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "pyvision_jax"


def setup_arguments(monkeypatch) -> dict:
    """The keyword arguments setup.py passes to setup(), evaluated in the checkout."""
    captured: dict = {}
    monkeypatch.chdir(ROOT)  # find_packages() searches the working directory
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    exec(compile((ROOT / "setup.py").read_text(encoding="utf-8"), "setup.py", "exec"), {"__name__": "setup_py"})
    return captured


def test_every_installed_top_level_name_is_the_projects(monkeypatch):
    arguments = setup_arguments(monkeypatch)
    top_level = {name.split(".")[0] for name in arguments["packages"]}
    assert top_level == {PROJECT, INSTALLED_PACKAGE}, f"generic top-level names installed: {top_level}"
    assert arguments["package_dir"] == {INSTALLED_PACKAGE: "configs"}
    assert set(arguments["package_data"]) <= top_level


def test_the_wheel_ships_the_configs_under_the_projects_name_and_an_installed_copy_finds_them(tmp_path):
    wheel = matrix.build_wheel(tmp_path / "build")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        site = tmp_path / "site"
        archive.extractall(site)
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {PROJECT, INSTALLED_PACKAGE}
    for shipped in (
        "tiny_cpu.py",
        "base.py",
        "prompts/judge.txt",
        "prompts/shapes_image.txt",
        "sandbox/shape_tools.py",
    ):
        assert f"{INSTALLED_PACKAGE}/{shipped}" in names, shipped
    # Outside the checkout, with only the unpacked wheel on the path: the default config and its
    # siblings, prompts and sandbox helpers all come from the installed package.
    script = (
        "import importlib.util, json, pyvision_jax\n"
        "from pyvision_jax.agent.templates import PROMPTS_DIR\n"
        "from pyvision_jax.cli.default_config import DEFAULT_CONFIG\n"
        "spec = importlib.util.spec_from_file_location('config', DEFAULT_CONFIG)\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "config = module.get_config()\n"
        "print(json.dumps([pyvision_jax.__file__, DEFAULT_CONFIG, str(PROMPTS_DIR), config.sandbox.setup_file,"
        " config.episode.image_prompt_file]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    package, *paths = json.loads(done.stdout.splitlines()[-1])
    assert package.startswith(str(site / PROJECT))
    configs = site / INSTALLED_PACKAGE
    assert paths == [
        str(configs / "tiny_cpu.py"),
        str(configs / "prompts"),
        str(configs / "sandbox" / "shape_tools.py"),
        str(configs / "prompts" / "shapes_image.txt"),
    ]


def test_the_configs_folder_is_the_installed_package_where_there_is_one(tmp_path):
    assert configs_dir(ROOT) == ROOT / "configs"
    (tmp_path / "configs").mkdir()  # another project's `configs` in the same site-packages
    assert configs_dir(tmp_path) == tmp_path / "configs"
    (tmp_path / INSTALLED_PACKAGE).mkdir()
    assert configs_dir(tmp_path) == tmp_path / INSTALLED_PACKAGE


def test_a_config_reads_its_siblings_by_path_however_it_was_loaded(tmp_path):
    (tmp_path / "base.py").write_text("VALUE = 7\n", encoding="utf-8")
    mine = tmp_path / "mine.py"
    mine.write_text(
        "from pyvision_jax.data.config_files import sibling\n\n\ndef get_config():\n    return sibling('base').VALUE\n",
        encoding="utf-8",
    )
    spec = importlib.util.spec_from_file_location("mine", mine)
    imported = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(imported)
    namespace: dict = {}  # as a script that compiles a config file with its path and runs it
    exec(compile(mine.read_text(encoding="utf-8"), str(mine), "exec"), namespace)
    assert imported.get_config() == namespace["get_config"]() == 7
    (tmp_path / "base.py").unlink()
    with pytest.raises(FileNotFoundError, match="mine.py: no config file .*base.py"):
        imported.get_config()
