#!/bin/bash
# Run every fuzz target for a fixed time: test/fuzz/run.sh BUILD SECONDS [TARGET...]
# Each target starts from test/fuzz/corpus/<target>/ plus what earlier runs
# found (BUILD/fuzz/corpus/<target>/, where new inputs go); a crash, leak or
# timeout fails the run and leaves its input in BUILD/fuzz/crashes/.
# FUZZ_JOBS targets run at once (default: the CPUs, nproc); each is
# single-threaded, so each still gets SECONDS of a CPU.
set -uo pipefail
build=${1:?usage: run.sh BUILD SECONDS [TARGET...]}
secs=${2:?usage: run.sh BUILD SECONDS [TARGET...]}
shift 2
cd "$(dirname "$0")/../.." || exit 1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(cd test/fuzz && ls fuzz_*.c | sed 's/\.c$//'))
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
mkdir -p "$build/fuzz/crashes"

# fuzz_one TARGET: run it; its verdict line goes to BUILD/fuzz/TARGET.result.
fuzz_one() {
    local t=$1 bin=$build/test/fuzz/$1 work=$build/fuzz/corpus/$1 log=$build/fuzz/$1.log
    local res=$build/fuzz/$1.result start rc runs cov
    if [ ! -x "$bin" ]; then
        echo "FAIL $t: $bin missing (make fuzz-targets)" >"$res"
        return
    fi
    mkdir -p "$work"
    start=$(date +%s)
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz/crashes/$t-" \
        "$work" "test/fuzz/corpus/$t" > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "PASS $t: ${runs:-?} inputs in $(( $(date +%s) - start )) s, ${cov:-cov: ?}, corpus $(ls "$work" | wc -l) files" >"$res"
    else
        { echo "FAIL $t (exit $rc): see $log"; grep -E "ERROR|SUMMARY|artifact" "$log" | head -5; } >"$res"
    fi
}

running=0
for t in "${targets[@]}"; do
    rm -f "$build/fuzz/$t.result"
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait
fails=0
for t in "${targets[@]}"; do
    cat "$build/fuzz/$t.result" 2>/dev/null || echo "FAIL $t: no result"
    grep -q '^PASS' "$build/fuzz/$t.result" 2>/dev/null || fails=$((fails + 1))
done
exit $((fails > 0))
