#!/usr/bin/env bash
# Run the test suite (or the pytest arguments given) beside a busy neighbour:
# one CPU hog per core, as a developer's laptop with a build running, then
# print pytest's summary line and the wall time of each run. A test whose
# verdict depends on how fast the machine was a moment ago fails here.
#
#   scripts/busy_suite.sh                       # the whole suite, once, hogs on every core
#   scripts/busy_suite.sh --runs 2              # twice in a row (the issue-30 evidence)
#   scripts/busy_suite.sh --quiet               # no hogs: the quiet run to compare with
#   scripts/busy_suite.sh --hogs 1 tests/test_draft_model.py -k residency
#
# Options (before the pytest arguments): --hogs N (default: every core,
# nproc), --quiet (same as --hogs 0), --runs K (default 1), --nice N (the
# hogs' niceness, default 0: they compete with the tests as equals).
# PYTHON selects the interpreter (default .venv/bin/python, else python3).
# The hogs are this script's children: killed when it ends, however it ends.
# Exit status: 0 when every run passed, else the last failing run's.
set -uo pipefail
cd "$(dirname "$0")/.."

hogs=$(nproc)
runs=1
niceness=0
while [ $# -gt 0 ]; do
    case "$1" in
        --hogs) hogs="${2:?--hogs needs a number}"; shift 2 ;;
        --quiet) hogs=0; shift ;;
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --nice) niceness="${2:?--nice needs a number}"; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
for v in "$hogs" "$runs" "$niceness"; do
    case "$v" in ''|*[!0-9]*) echo "busy_suite: --hogs, --runs and --nice take whole numbers (got '$v')" >&2; exit 2 ;; esac
done
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

pids=()
stop_hogs() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
    pids=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

start_hogs() {
    # a pure-Python busy loop: one core each, no memory, no package needed;
    # it ends by itself after 3 hours should this script be killed with -9
    for _ in $(seq 1 "$hogs"); do
        nice -n "$niceness" "$PYTHON" -c 'import time
end = time.monotonic() + 3 * 3600
while time.monotonic() < end:
    sum(i * i for i in range(10000))' &
        pids+=("$!")
    done
}

echo "busy_suite: $(nproc) cores, $hogs hog(s) at nice $niceness, $runs run(s); pytest ${*:-(the whole suite)}"
echo "busy_suite: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for run in $(seq 1 "$runs"); do
    start_hogs
    log=$(mktemp -t busy_suite.XXXXXX)
    t0=$(date +%s)
    "$PYTHON" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
    rc=$?
    t1=$(date +%s)
    stop_hogs
    summary=$(grep -E '^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s|no tests ran' "$log" | tail -1)
    echo "busy_suite: run $run/$runs: exit $rc in $((t1 - t0)) s with $hogs hog(s): ${summary:-no summary line}"
    if [ "$rc" -ne 0 ]; then
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/busy_suite:   /'
        echo "busy_suite: full output in $log"
        status=$rc
    else
        rm -f "$log"
    fi
done
exit "$status"
