"""The fleet environment (.venv-vllm, scripts/install_fleet.sh) holds everything the rollout worker,
the vLLM engine and the LLM judge import: each module imports there and the worker's command
starts far enough to check its config."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import vllm  # noqa: F401  (runs in .venv-vllm: scripts/install_fleet.sh cpu)

ROOT = Path(__file__).resolve().parents[2]
FLEET_MODULES = (
    "pyvision_jax.cli.rollout_worker",
    "pyvision_jax.rollout.worker",
    "pyvision_jax.rollout.vllm_engine",
    "pyvision_jax.rollout.vllm_processors",
    "pyvision_jax.grading.judge",
    "pyvision_jax.grading.routes",
    "pyvision_jax.wiring.rollouts",
    "pyvision_jax.wiring.engines",
)


@pytest.mark.parametrize("name", FLEET_MODULES)
def test_the_fleet_modules_import_in_the_fleet_environment(name):
    module = importlib.import_module(name)
    assert module.__file__.startswith(str(ROOT / "pyvision_jax"))


def test_the_worker_command_checks_its_config_in_the_fleet_environment(tmp_path):
    """A bad engine name is refused by the worker's start-up check: everything up to it imported."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "rollout_worker.py"), "--config.rollout.engine=nope"]
        + ["--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--config.rollout.engine='nope'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_documented_fleet_environment_commands_run_in_miniature(tmp_path):
    """The docs' `.venv-vllm/bin/python ...` commands, planned in tests/test_doc_commands.py."""
    from tests.doc_commands import doc_commands, miniature_argv
    from tests.test_doc_commands import all_plans

    commands = {c.text for c in doc_commands() if c.text.startswith(".venv-vllm/bin/python ")}
    assert commands, "the docs name no command of the fleet environment"
    for command in sorted(commands):
        plan = all_plans()[command]
        assert plan.env.get("ENVIRONMENT") == "fleet", command
        argv = miniature_argv(command, plan, tmp_path, {}, sys.executable)
        argv[0] = sys.executable
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=plan.timeout_s)
        assert done.returncode == 0, f"{' '.join(argv)}\n{done.stderr[-4000:]}"
