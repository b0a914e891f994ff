#!/usr/bin/env bash
# gpu_check_wheels.sh: fetch, where pip can reach its index, the wheels that `scripts/gpu_check.sh --wheels DIR`
# installs on a machine that reaches none: this workplace's lent H200 (CPython 3.12, x86-64, glibc), whose image
# holds torch, psutil, nvidia-ml-py, pytest and prometheus-client but not py-spy. The headless steps of the check
# (snapshot, report, check) need nothing else: they never import Textual.
#
# Usage: scripts/gpu_check_wheels.sh [DIR]     (default: .whl in the repo's root, which git ignores)
#   GPU_CHECK_PYTHON_VERSION=3.12   the target machine's Python (major.minor)
#
# The versions are the ones installed here, so the GPU machine runs what this checkout was tested with;
# nvidia-ml-py is carried although the image has one, because gputop needs 13.x (its field-value names).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$ROOT/.whl}"
PYTHON="${PYTHON:-python3}"
TARGET_PYTHON="${GPU_CHECK_PYTHON_VERSION:-3.12}"
version() {
    "$PYTHON" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null \
        || { echo "gpu_check_wheels.sh: $1 is not installed here; install gputop first (pip install -e .)" >&2; exit 2; }
}
PY_SPY="$(version py-spy)"
NVML="$(version nvidia-ml-py)"
mkdir -p "$DIR"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$DIR" "py-spy==$PY_SPY" "nvidia-ml-py==$NVML"
ls -l "$DIR"/*.whl
echo "next: carry this folder in the device call and run gpu_check.sh --wheels on it (its header has the call)"
