#!/usr/bin/env bash
# Installs everything, then runs the test suite. Exit code 5 (no tests collected) fails.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh || exit 1
.venv/bin/python -m pytest -q tests "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
