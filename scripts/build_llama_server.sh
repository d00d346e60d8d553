#!/usr/bin/env bash
# Build (or find, cached) llama.cpp's llama-server for this CPU from the
# llama.cpp source vendored in llama-cpp-python 0.3.36's sdist, and print its
# path. The bench's llama.vscode column and its test use it. Flags and cache:
# bench/soldaemon_bench/quality/llama_server_build.py; docs/bench.md.
#   scripts/build_llama_server.sh [-j N]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m soldaemon_bench.quality.llama_server_build "$@"
