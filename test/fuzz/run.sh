#!/bin/bash
# Run every fuzz target for a fixed time: test/fuzz/run.sh BUILD SECONDS [TARGET...]
# Each target starts from test/fuzz/corpus/<target>/ plus what earlier runs
# found (BUILD/fuzz/corpus/<target>/, where new inputs go); a crash, leak or
# timeout fails the run and leaves its input in BUILD/fuzz/crashes/.
set -uo pipefail
build=${1:?usage: run.sh BUILD SECONDS [TARGET...]}
secs=${2:?usage: run.sh BUILD SECONDS [TARGET...]}
shift 2
cd "$(dirname "$0")/../.." || exit 1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(cd test/fuzz && ls fuzz_*.c | sed 's/\.c$//'))
mkdir -p "$build/fuzz/crashes"
fails=0
for t in "${targets[@]}"; do
    bin=$build/test/fuzz/$t
    [ -x "$bin" ] || { echo "FAIL $t: $bin missing (make fuzz-targets)"; fails=$((fails + 1)); continue; }
    work=$build/fuzz/corpus/$t
    mkdir -p "$work"
    log=$build/fuzz/$t.log
    start=$(date +%s)
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz/crashes/$t-" \
        "$work" "test/fuzz/corpus/$t" > "$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "PASS $t: ${runs:-?} inputs in $(( $(date +%s) - start )) s, ${cov:-cov: ?}, corpus $(ls "$work" | wc -l) files"
    else
        echo "FAIL $t (exit $rc): see $log"; grep -E "ERROR|SUMMARY|artifact" "$log" | head -5
        fails=$((fails + 1))
    fi
done
exit $((fails > 0))
