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
# the project's environment, where there is one: it knows the tested versions and has pip
VENV_PY=.venv/bin/python
# seen missing on the H200 image (2026-12-04); tests/test_gpu_check.py keeps this list
# and the image's package list (docs/gpu.md) covering every runtime dependency
PACKAGES=(platformdirs detect-secrets)
mkdir -p "$DIR"

version_of() {   # the version installed for $PY, else for the project's environment; empty: neither
    local py
    for py in "$PY" "$VENV_PY"; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null && return
    done
}

PIP_PY=$PY
"$PIP_PY" -m pip --version >/dev/null 2>&1 || PIP_PY=$VENV_PY   # a bare python3 without pip
specs=()
for name in "${PACKAGES[@]}"; do
    version=$(version_of "$name")
    if [ -n "$version" ]; then
        specs+=("$name==$version")
    else
        echo "gpu_wheels.sh: $name is installed in neither $PY nor $VENV_PY: the newest wheel" >&2
        specs+=("$name")
    fi
done
"$PIP_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
    -d "$DIR" "${specs[@]}"
ls "$DIR"
