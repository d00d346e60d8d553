#!/usr/bin/env bash
# The GPU path, proven in one command (issues 18 and 27): the GPU-marked
# tests, the self-checking latency and memory scripts on random-weight
# models of Qwen2.5-Coder's 0.5B and 1.5B shapes (0.5B first), and
# `soldaemon doctor --json` against the real driver. No network, no pip
# install from a registry: runs from this checkout with PYTHONPATH, on a
# machine that has torch, transformers, safetensors, tokenizers, psutil,
# pyyaml, tqdm, pytest and nvidia-ml-py (no websockets, pygls, gguf or
# tree-sitter needed). The H200 image lacks platformdirs and detect-secrets
# (seen on 2026-12-04): scripts/gpu_wheels.sh fetches them here as wheels,
# and --wheels DIR installs those into a temporary folder on the path.
#
#   bash scripts/gpu_wheels.sh                    # here, once: .whl/ <- the wheels the device image lacks
#   GPU_CHECK_COMMIT=<hash> bash scripts/gpu_check.sh --out "$OUT" --wheels .whl   # on a CUDA machine (~5 min)
#   bash scripts/gpu_check.sh --cpu --out DIR     # the same end to end on the tiny model (CI; 20-60 s here)
#
# The report cannot be lost: every step writes its JSON into OUT/steps/ as
# it finishes, and summary.md + gpu_check.json are re-rendered from what is
# there after every step (and on SIGTERM/SIGINT), so a run killed by a time
# limit still leaves a report of the steps done that names the missing
# ones. At the end (or on the signal) steps/ is packed into steps.tar.gz, so
# the out folder (default $OUT, else ./gpu-check-out) holds four files, under
# the device tool's limit of 8: summary.md (also printed at the end),
# gpu_check.json (every figure, the commit, the head of `nvidia-smi -q` and
# every step's JSON), log.txt (every step's output) and steps.tar.gz. The
# commit: GPU_CHECK_COMMIT, else `git rev-parse HEAD` where there is a
# .git (the device copy has none: pass it). Exit status:
# 0 when every planned step ran and every check passed, 1 otherwise
# (summary.md says which). Options: --shapes "0.5b 1.5b", --budget-s N
# (skip the steps that would end after N s; default 330 on CUDA, which with
# the machine's start keeps the run within 6 minutes),
# --wheels DIR (pure-Python wheels to put on the path first),
# --require-targets (a missed performance target fails too), PYTHON=...
# The first shape's latency step also times the model alone, compiled
# (transformers' forward over a static cache under torch.compile, gpt-fast's
# recipe): the anchor beside generate(); and its engine measures our decoder
# layer under inductor inside our graphs (runtime/forward/compiled.py: kept
# where faster, with its compile time; the report's "layer compiled" line).
# The other steps run the eager layer (SOLDAEMON_LAYER_COMPILE=off), so the
# compile is paid once.
#
# A CUDA run fails when its graph path did not run: the scripts use their
# own explicit config (never a user config from load_config(None)), with
# device.cuda_graphs on, and fail when no graph was replayed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=cuda
OUTDIR=${OUT:-$ROOT/gpu-check-out}
SHAPES="0.5b 1.5b"
BUDGET_S=""
WHEELS=""
REPORT_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu; shift ;;
        --out) OUTDIR=$2; shift 2 ;;
        --shapes) SHAPES=$2; shift 2 ;;
        --budget-s) BUDGET_S=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --require-targets) REPORT_ARGS+=(--require-targets); shift ;;
        *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$MODE" = cpu ]; then
    SHAPES=tiny
    # a dry run of the path, not a CPU benchmark: one thread (two spinning
    # OpenMP threads on a shared 2-core machine made it 9x slower)
    export OMP_NUM_THREADS=1
    BUDGET_S=${BUDGET_S:-0}
else
    BUDGET_S=${BUDGET_S:-330}
fi

PY=${PYTHON:-python3}
COMMIT=${GPU_CHECK_COMMIT:-}
if [ -z "$COMMIT" ]; then
    COMMIT=$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git here; set GPU_CHECK_COMMIT)")
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT+uncommitted changes"
fi
# the daemon and its benchmarks (bench/: tests/test_graphcheck.py, gpu_latency.py use them)
export PYTHONPATH="$ROOT:$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SOLDAEMON_LAYER_COMPILE=off       # the first shape's latency step measures it (auto), below
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
if [ -n "$WHEELS" ]; then
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
        || { echo "gpu_check.sh: could not install the wheels in $WHEELS" >&2; exit 2; }
    export PYTHONPATH="$SITE:$PYTHONPATH"
fi
STEPS=$OUTDIR/steps                      # each step's JSON, as it finishes
rm -rf "$STEPS"
mkdir -p "$STEPS"
MODELS=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")   # random-weight models: never copied back
# their kernel plans (and any state) stay in that folder, never in the user's
# cache: a random or tiny model's table there is not the user's model's
export SOLDAEMON_CACHE_DIR="$MODELS/cache" SOLDAEMON_STATE_DIR="$MODELS/state"
LOG=$OUTDIR/log.txt
: >"$LOG"
: >"$STEPS/steps.tsv"
T_START=$(date +%s)
read -r -a shape_list <<<"$SHAPES"

# The plan, with an estimate per step on one H200 (seconds: the first device
# run, 2026-12-04, took env 6, nvidia-smi 0, pytest 19, build 13/16, latency
# 69/92, memory 18/29, doctor 0; the float32 anchor adds a little to the
# latency steps). Total ~270 s plus the machine's start (~30 s). CPU mode:
# the tiny model, 20-60 s on a loaded 2-core VM.
PLANNED=(env)
[ "$MODE" = cuda ] && PLANNED+=(nvidia-smi)
PLANNED+=(pytest)
for shape in "${shape_list[@]}"; do PLANNED+=("build-$shape" "latency-$shape" "memory-$shape"); done
PLANNED+=(doctor)
declare -A EST=([env]=8 [nvidia-smi]=2 [pytest]=30 [doctor]=5
                [build-0.5b]=15 [latency-0.5b]=160 [memory-0.5b]=20
                [build-1.5b]=20 [latency-1.5b]=100 [memory-1.5b]=30
                [build-tiny]=5 [latency-tiny]=40 [memory-tiny]=10)

report() {   # report [--partial]: render summary.md and gpu_check.json from what the steps left
    "$PY" scripts/gpu_check_report.py --work "$STEPS" --out "$OUTDIR" --mode "$MODE" \
        --shapes "${shape_list[@]}" --planned "${PLANNED[@]}" --commit "$COMMIT" \
        ${REPORT_ARGS[@]+"${REPORT_ARGS[@]}"} "$@"
}
pack_steps() {   # steps/ -> steps.tar.gz (what gpu_check.json does not hold: pytest.xml, nvidia-smi -q)
    tar -czf "$OUTDIR/steps.tar.gz" -C "$OUTDIR" steps && rm -rf "$STEPS"
}
CHILD=""
on_signal() {
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
    echo "gpu_check.sh: interrupted; the report holds the steps done" | tee -a "$LOG"
    report --partial --quiet
    pack_steps
    rm -rf "$MODELS"
    exit 1
}
trap on_signal TERM INT
trap 'rm -rf "$MODELS"' EXIT

# step NAME CMD...: run CMD (killed at 3x its estimate) with its output in
# the log; record its status and ms; re-render the report
step() {
    local name=$1; shift
    local t0 rc est=${EST[$name]:-60} now
    now=$(date +%s)
    if [ "$BUDGET_S" -gt 0 ] && [ $((now - T_START + est)) -gt "$BUDGET_S" ]; then
        echo "=== $name: skipped (it would end past the ${BUDGET_S} s budget)" | tee -a "$LOG"
        printf '%s\t%s\t%s\n' "$name" "skipped" 0 >>"$STEPS/steps.tsv"
        report --partial --quiet
        return
    fi
    t0=$(date +%s%N)
    echo "=== $name (estimate ${est} s): $*" | tee -a "$LOG"
    timeout -s TERM $((3 * est + 30)) "$@" >>"$LOG" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" >>"$STEPS/steps.tsv"
    [ "$rc" = 0 ] || echo "    $name exited $rc (see log.txt)"
    report --partial --quiet
}

step env "$PY" -c 'import platform, torch, transformers; print(platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available(), "transformers", transformers.__version__);
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")'
if [ "$MODE" = cuda ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        step nvidia-smi sh -c "nvidia-smi -q >\"$STEPS/nvidia-smi-q.txt\"; nvidia-smi"
    else
        printf '%s\t%s\t%s\n' nvidia-smi 127 0 >>"$STEPS/steps.tsv"
    fi
fi

# Only the GPU-marked tests (on a CPU they are collected and skipped); the
# CPU tests of these files run in the suite.
TESTS=(tests/test_cudagraph.py tests/test_graphcheck.py tests/test_gpu_attention.py)
step pytest "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -m gpu "${TESTS[@]}" \
    --junitxml="$STEPS/pytest.xml"

COMPILED=(--compiled)                    # the first shape only (the compile takes ~40 s on a GPU)
LAYER=(env SOLDAEMON_LAYER_COMPILE=auto) # the first shape only: the layer under inductor, measured at load
for shape in "${shape_list[@]}"; do
    model=$MODELS/model-$shape
    if [ "$MODE" = cpu ]; then
        # 8 layers, so that a budget can offload some beside the staging ring
        step "build-$shape" "$PY" -c "from soldaemon_bench.tiny import build_tiny_model as b; b('$model', layers=8)"
        # float32 pinned: the eager path is compared with transformers' forward only under a dense
        # plan (a device's is; the tiny model's auto plan on a CPU is int8 while speculation is on)
        step "latency-$shape" "$PY" scripts/gpu_latency.py --model "$model" --device cpu --emulate-graphs \
            --precision float32 --require-graphs --holes 2 --tokens 8 --check-steps 12 --prefill-tokens 256 --lines 1 \
            --attention-positions 255 1000 4000 ${COMPILED[@]+"${COMPILED[@]}"} --json "$STEPS/lat-$shape.json"
        step "memory-$shape" "$PY" scripts/gpu_memory.py --model "$model" --device cpu --prompt-tokens 160 \
            --tokens 4 --repeats 1 --pcts 100 25 --json "$STEPS/mem-$shape.json"
    else
        step "build-$shape" "$PY" -c "from soldaemon_bench.tiny import build_shaped_model as b; b('$model', '$shape')"
        step "latency-$shape" ${LAYER[@]+"${LAYER[@]}"} "$PY" scripts/gpu_latency.py --model "$model" --device cuda --require-graphs \
            --holes 4 --tokens 48 --check-steps 48 --prefill-tokens 1024 --lines 2 \
            --attention-positions 255 1000 4000 ${COMPILED[@]+"${COMPILED[@]}"} --json "$STEPS/lat-$shape.json"
        step "memory-$shape" "$PY" scripts/gpu_memory.py --model "$model" --device cuda --prompt-tokens 512 \
            --tokens 32 --repeats 2 --json "$STEPS/mem-$shape.json"
        rm -rf "$model"
    fi
    COMPILED=()
    LAYER=()
done

# `soldaemon doctor --json` (the module: the CLI also imports the server's websockets)
step doctor sh -c "\"$PY\" -m soldaemon.doctor.checks --json >\"$STEPS/doctor.json\""

report
rc=$?
pack_steps
exit $rc
