#!/usr/bin/env bash
# The wheels of benchmarks/accelerator_wheels.txt, carried to the device machine.
#
#   bash benchmarks/accelerator_wheels.sh download build/accelerator_wheels [PYTHON_VERSION]
#       here (with network): fetch them, no dependencies, for the device's Python (default 3.12)
#   bash benchmarks/accelerator_wheels.sh install build/accelerator_wheels /tmp/site
#       on the device machine (no network): install them into /tmp/site; then
#       export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
list=benchmarks/accelerator_wheels.txt
action=${1:?usage: $0 download DIR [PYTHON_VERSION] | install DIR TARGET}
dir=${2:?the wheel folder}
case "$action" in
  download)
    version=${3:-3.12}
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d "$dir" -r "$list"
    ls -l "$dir"
    ;;
  install)
    target=${3:?the scratch folder to install into}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --find-links "$dir" --target "$target" -r "$list"
    PYTHONPATH="$target" python3 -c "import ml_collections; print('wheels installed in $target')"
    ;;
  *)
    echo "unknown action $action: download or install" >&2
    exit 2
    ;;
esac
