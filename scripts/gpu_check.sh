#!/usr/bin/env bash
# The GPU path, proven in one command (issue 18): the CUDA tests, the
# self-checking latency and memory scripts on random-weight models of
# Qwen2.5-Coder's 0.5B and 1.5B shapes, and `soldaemon doctor --json`
# against the real driver. No network, no pip install: runs from this
# checkout with PYTHONPATH, on a machine that has torch, transformers,
# safetensors, tokenizers, psutil, pyyaml, tqdm, pytest and nvidia-ml-py
# (no websockets, pygls or gguf needed).
#
#   bash scripts/gpu_check.sh --out "$OUT"        # on a CUDA machine (estimated 3-5 min on an H200: never run yet)
#   bash scripts/gpu_check.sh --cpu --out DIR     # the same end to end on the tiny model (CI; 15-36 s here)
#
# Writes to the out folder (default $OUT, else ./gpu-check-out): summary.md
# (also printed), gpu_check.json (every figure, check and reading) and
# log.txt (every step's output). Exit status: 0 when every check passed,
# 1 when one failed (summary.md says which). Options: --shapes "0.5b 1.5b",
# --require-targets (a missed performance target fails too), PYTHON=...
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=cuda
OUTDIR=${OUT:-$ROOT/gpu-check-out}
SHAPES="0.5b 1.5b"
REPORT_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu; shift ;;
        --out) OUTDIR=$2; shift 2 ;;
        --shapes) SHAPES=$2; shift 2 ;;
        --require-targets) REPORT_ARGS+=(--require-targets); shift ;;
        *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$MODE" = cpu ]; then
    SHAPES=tiny
    # a dry run of the path, not a CPU benchmark: one thread (two spinning
    # OpenMP threads on a shared 2-core machine made it 9x slower)
    export OMP_NUM_THREADS=1
fi

PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG=$OUTDIR/log.txt
: >"$LOG"
: >"$WORK/steps.tsv"

# step NAME CMD...: run CMD with its output in the log; record its status and ms
step() {
    local name=$1; shift
    local t0 rc
    t0=$(date +%s%N)
    echo "=== $name: $*" | tee -a "$LOG"
    "$@" >>"$LOG" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" >>"$WORK/steps.tsv"
    [ "$rc" = 0 ] || echo "    $name exited $rc (see log.txt)"
}

step env "$PY" -c 'import platform, torch, transformers; print(platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available(), "transformers", transformers.__version__);
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'
if [ "$MODE" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    step nvidia-smi nvidia-smi
fi

# The CUDA tests (marked gpu): on a CPU they are collected and skipped.
TESTS=(tests/test_cudagraph.py tests/test_graphcheck.py)
if [ "$MODE" = cuda ]; then
    # on the device also the CPU tests of the GPU path, under its torch/transformers
    step pytest "$PY" -m pytest -q -p no:cacheprovider -o addopts="" "${TESTS[@]}" tests/test_timing.py \
        tests/test_kvfold.py
else
    step pytest "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -m gpu "${TESTS[@]}"
fi

for shape in $SHAPES; do
    model=$WORK/model-$shape
    if [ "$MODE" = cpu ]; then
        # 8 layers, so that a budget can offload some beside the staging ring
        step "build-$shape" "$PY" -c "from soldaemon.testing.tiny import build_tiny_model as b; b('$model', layers=8)"
        step "latency-$shape" "$PY" scripts/gpu_latency.py --model "$model" --device cpu --emulate-graphs \
            --holes 2 --tokens 8 --check-steps 12 --prefill-tokens 256 --lines 1 --json "$WORK/lat-$shape.json"
        step "memory-$shape" "$PY" scripts/gpu_memory.py --model "$model" --device cpu --prompt-tokens 160 \
            --tokens 4 --repeats 1 --pcts 100 25 --json "$WORK/mem-$shape.json"
    else
        step "build-$shape" "$PY" -c "from soldaemon.testing.tiny import build_shaped_model as b; b('$model', '$shape')"
        step "latency-$shape" "$PY" scripts/gpu_latency.py --model "$model" --device cuda \
            --holes 6 --tokens 48 --check-steps 64 --prefill-tokens 1024 --lines 2 --json "$WORK/lat-$shape.json"
        step "memory-$shape" "$PY" scripts/gpu_memory.py --model "$model" --device cuda --prompt-tokens 512 \
            --tokens 32 --repeats 2 --json "$WORK/mem-$shape.json"
        rm -rf "$model"
    fi
done

# `soldaemon doctor --json` (the module: the CLI also imports the server's websockets)
step doctor sh -c "\"$PY\" -m soldaemon.doctor --json >\"$WORK/doctor.json\""

read -r -a shape_list <<<"$SHAPES"
"$PY" scripts/gpu_check_report.py --work "$WORK" --out "$OUTDIR" --mode "$MODE" --shapes "${shape_list[@]}" \
    ${REPORT_ARGS[@]+"${REPORT_ARGS[@]}"}
