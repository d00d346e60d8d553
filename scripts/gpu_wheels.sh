#!/usr/bin/env bash
# The runtime dependencies the device image lacks, as wheels for
# `scripts/gpu_check.sh --wheels .whl` (the device reaches no registry).
# Run here, in the repository root, before the device call that carries
# .whl (git ignores it through .git/info/exclude: see docs/gpu.md).
# The versions are the ones installed here, so the device runs what the
# tests ran; the packages are pure Python. DEVICE_PYTHON: the device's
# Python (default 3.12, the H200 image's).
#
#   bash scripts/gpu_wheels.sh [DIR]      # default .whl
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-python3}
# seen missing on the H200 image (2026-12-04); tests/test_gpu_check.py keeps this list
# and the image's package list (docs/gpu.md) covering every runtime dependency
PACKAGES=(platformdirs detect-secrets)
mkdir -p "$DIR"
specs=()
for name in "${PACKAGES[@]}"; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    specs+=("$name==$version")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
    -d "$DIR" "${specs[@]}"
ls "$DIR"
