#!/usr/bin/env bash
# Installs pyvision_jax for CPU training and the tests into ./.venv, every dependency pinned by the
# lock constraints.txt, plus the Debian packages the sandbox, the queue and the report test need
# (bubblewrap, redis-server, chromium, openssl for the queue's TLS test). GPU and TPU trainers: README "Installing on GPU and TPU".
# Idempotent.
#   bash scripts/install.sh          # runtime + test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1; then
  missing=()
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU torch first, by exact version, so no resolver ever pulls a CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[cpu,test]"
