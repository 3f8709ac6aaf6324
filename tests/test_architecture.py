"""The house rules, checked on the source: package layering (no upward imports, no circles),
no function-local imports of the project's own modules, and no module over 500 lines; the
research code (experiments/) and the benchmarks sit above the library, which never imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyvision_jax"
MAX_LINES = 500

# Lower layers first; a package may import only from packages listed before it (and itself).
LAYERS = (
    "models",
    "processing",
    "convert",
    "data",
    "agent",
    "grading",
    "rl",
    "run_logs",
    "rollout",
    "train",
    "eval",
    "wiring",
    "cli",
)

# Top-level folders above the library, side by side: each may import all of pyvision_jax.
ABOVE_LIBRARY = ("experiments", "benchmarks")

# Pairs on one level of which neither imports the other: evaluation loads and evaluates
# checkpoints without the trainer, and no benchmark depends on an experiment or the reverse.
INDEPENDENT = (("train", "eval"), ("experiments", "benchmarks"))

# Packages that take typed settings and built objects: the composition root (`wiring`) reads the config.
CONFIG_FREE = ("train", "eval")

# Heavy optional dependencies that are imported where used, with a clear error when missing.
OPTIONAL_LOCAL_IMPORTS = (
    "vllm",
    "torch",
    "redis",
    "safetensors",
    "transformers",
    "math_verify",
    "pyvision_jax.rollout.vllm_engine",
)


def _modules(*folders: str) -> dict[str, Path]:
    out = {}
    for path in sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")[: -node.level] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, extra_roots: tuple[str, ...] = ()) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every project import of `module` (and
    every import of the top-level packages `extra_roots`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks count as module level
        if isinstance(node, ast.If):
            top_level.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in PROJECT_ROOTS or root in OPTIONAL_LOCAL_IMPORTS or root in extra_roots:
                found.append((name, node.lineno, id(node) in top_level))
    return found


def _package(module: str) -> str:
    """The layer of `module`: its package under pyvision_jax, or its top-level folder."""
    parts = module.split(".")
    if parts[0] != "pyvision_jax":
        return parts[0]
    return parts[1] if len(parts) > 1 else ""


def _rank(package: str) -> int:
    return len(LAYERS) if package in ABOVE_LIBRARY else LAYERS.index(package)


PROJECT_ROOTS = ("pyvision_jax", *ABOVE_LIBRARY)
MODULES = _modules(*PROJECT_ROOTS)
LIBRARY = {name: path for name, path in MODULES.items() if name.split(".")[0] == "pyvision_jax"}
SIZE_CHECKED = {name: path for name, path in MODULES.items() if name.split(".")[0] in ("pyvision_jax", "experiments")}


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for module, path in MODULES.items():
        for name, _, _ in _imports(module, path):
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def test_layers_known():
    packages = {_package(m) for m in LIBRARY} - {""}
    assert packages <= set(LAYERS), f"packages missing from LAYERS: {sorted(packages - set(LAYERS))}"


def test_no_upward_imports_between_packages():
    upward = []
    for module, targets in _edges().items():
        here = _package(module)
        for target in targets:
            there = _package(target)
            if here and there and _rank(there) > _rank(here):
                upward.append(f"{module} -> {target}")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_library_imports_neither_experiments_nor_benchmarks():
    found = [
        f"{module} -> {target}"
        for module, targets in _edges().items()
        if module in LIBRARY
        for target in targets
        if target.split(".")[0] in ABOVE_LIBRARY
    ]
    assert not found, "pyvision_jax imports research or benchmark code:\n" + "\n".join(sorted(found))


@pytest.mark.parametrize("pair", INDEPENDENT, ids="-".join)
def test_independent_packages_import_neither_other(pair):
    found = [
        f"{module} -> {target}"
        for module, targets in _edges().items()
        for target in targets
        if {_package(module), _package(target)} == set(pair)
    ]
    assert not found, f"{pair[0]} and {pair[1]} must not import each other:\n" + "\n".join(sorted(found))


def test_no_import_cycles():
    graph = _edges()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    # A package __init__ that re-exports its submodules is not a cycle of concern.
    real = [
        c
        for c in cycles
        if not all(part == c.split(" -> ")[0] or part.startswith(c.split(" -> ")[0] + ".") for part in c.split(" -> "))
    ]
    assert not real, "import cycles:\n" + "\n".join(real)


def test_no_function_local_project_imports():
    local = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for module, path in MODULES.items()
        if _package(module) != "benchmarks"
        for name, line, top in _imports(module, path)
        if not top and name.split(".")[0] in PROJECT_ROOTS and not name.startswith(OPTIONAL_LOCAL_IMPORTS)
    ]
    assert not local, "function-local imports of the project's own modules:\n" + "\n".join(sorted(set(local)))


@pytest.mark.parametrize("module", sorted(SIZE_CHECKED))
def test_module_size(module):
    lines = len(SIZE_CHECKED[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{SIZE_CHECKED[module].relative_to(ROOT)} has {lines} lines (limit {MAX_LINES})"


def test_training_and_evaluation_never_read_a_config():
    """train/ and eval/ import neither ml_collections nor the composition root."""
    offenders = [
        f"{module}:{line} imports {name}"
        for module, path in MODULES.items()
        if _package(module) in CONFIG_FREE
        for name, line, _ in _imports(module, path, extra_roots=("ml_collections",))
        if name.split(".")[0] == "ml_collections" or name.startswith("pyvision_jax.wiring")
    ]
    assert not offenders, "\n".join(offenders)


def test_no_sys_path_insert_anywhere():
    """Every script imports the installed package; none edits sys.path."""
    found = [
        str(path.relative_to(ROOT))
        for folder in ("pyvision_jax", "launch", "benchmarks", "experiments", "scripts", "tests", "configs")
        for path in (ROOT / folder).rglob("*.py")
        if "sys.path.insert" in path.read_text() and path.name != "test_architecture.py"
    ]
    assert not found, f"sys.path.insert in {found}"


def test_scripts_import_at_the_top():
    """Benchmarks and experiments run as modules (`python -m benchmarks.NAME`): every import
    at the top, none after code that must run first."""
    marker = "noqa: " + "E402"
    found = [
        str(path.relative_to(ROOT))
        for folder in ABOVE_LIBRARY
        for path in (ROOT / folder).rglob("*.py")
        if marker in path.read_text()
    ]
    assert not found, f"{marker} in {found}"
