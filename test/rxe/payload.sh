#!/bin/bash
# Default payload of the Soft-RoCE harness; runs inside the guest (see
# README.md). Prints the environment, then runs every executable
# test/rxe/tests.d/*.sh in sorted order, each under `timeout`:
#   exit 0 -> PASS, 77 -> SKIP (the script prints why, last line), else FAIL.
# Exits 1 if any test failed, 0 otherwise.
#
# RXE_TESTS="glob ..."     run only tests whose name (file name without .sh)
#                          matches one of the globs
# RXE_TEST_TIMEOUT=SEC     default per-test timeout (300); a script can set
#                          its own with a line "# rxe-timeout: SEC"
# RXE_TESTS_DIR=DIR        run DIR/*.sh instead of test/rxe/tests.d/*.sh
set -uo pipefail

HARNESS=${RXE_HARNESS:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
# shellcheck source=test/rxe/lib.sh
. "$HARNESS/lib.sh"
OUT=${RXE_OUT:-/tmp/rxe-out}
mkdir -p "$OUT"
DEFAULT_TIMEOUT=${RXE_TEST_TIMEOUT:-300}
TESTS_DIR=${RXE_TESTS_DIR:-$HARNESS/tests.d}

section() { printf '\n===== %s\n' "$*"; }

print_env() {
    section "environment"
    uname -a
    echo "repo: ${RXE_REPO:-?}  out: $OUT  mtu: ${RXE_MTU:-?}"
    section "rdma link"
    rdma link show
    section "ibv_devices"
    ibv_devices
    section "GID tables"
    local d
    for d in /sys/class/infiniband/*; do
        [ -e "$d" ] && rxe_gid_table "${d##*/}"
    done
    echo "IPv4 GID index: rxe0 ${RXE_GID_INDEX0:-?}, rxe1 ${RXE_GID_INDEX1:-?}"
}

selected() {
    local name=$1 g
    [ -z "${RXE_TESTS:-}" ] && return 0
    # Globs are matched against test names, never expanded as file names.
    local -a globs
    read -ra globs <<<"$RXE_TESTS"
    for g in "${globs[@]}"; do
        # shellcheck disable=SC2053
        [[ $name == $g ]] && return 0
    done
    return 1
}

test_timeout() {
    local t
    t=$(sed -n 's/^# *rxe-timeout: *\([0-9][0-9]*\).*/\1/p' "$1" | head -n1)
    echo "${t:-$DEFAULT_TIMEOUT}"
}

# run_one SCRIPT NAME TIMEOUT: output streams to the console and to
# $OUT/NAME.log; the exit status goes to $OUT/NAME.rc (read, then removed). Processes the test
# leaves behind (its process group) are killed when it returns, so that they
# cannot hold the pipe to tee open.
run_one() {
    local script=$1 name=$2 tmo=$3
    {
        RXE_TEST_NAME=$name RXE_TEST_OUT=$OUT/$name timeout -k 10 "$tmo" "$script" </dev/null &
        local pid=$!
        wait "$pid"
        local rc=$?
        kill -KILL -- "-$pid" 2>/dev/null
        echo "$rc" >"$OUT/$name.rc"
    } 2>&1 | tee "$OUT/$name.log"
}

print_env

PASSED=() FAILED=() SKIPPED=()
section "tests"
shopt -s nullglob
for script in $(printf '%s\n' "$TESTS_DIR"/*.sh | LC_ALL=C sort); do
    name=$(basename "$script" .sh)
    [ -x "$script" ] || { echo "(not executable, ignored: $script)"; continue; }
    selected "$name" || continue
    tmo=$(test_timeout "$script")
    mkdir -p "$OUT/$name"
    section "RUN $name (timeout ${tmo}s)"
    start=$SECONDS
    rm -f "$OUT/$name.rc"
    run_one "$script" "$name" "$tmo"
    rc=$(cat "$OUT/$name.rc" 2>/dev/null)
    rm -f "$OUT/$name.rc"
    rc=${rc:-125}
    took=$((SECONDS - start))
    case $rc in
    0)
        echo "PASS $name (${took}s)"
        PASSED+=("$name")
        ;;
    77)
        reason=$(grep -v '^[[:space:]]*$' "$OUT/$name.log" | tail -n1)
        echo "SKIP $name: ${reason:-(no reason given)}"
        SKIPPED+=("$name")
        ;;
    124 | 137)
        echo "FAIL $name ($rc: timed out after ${tmo}s)"
        FAILED+=("$name")
        ;;
    *)
        echo "FAIL $name ($rc)"
        FAILED+=("$name")
        ;;
    esac
done

section "summary"
summary="rxe tests: ${#PASSED[@]} passed, ${#FAILED[@]} failed, ${#SKIPPED[@]} skipped"
[ ${#FAILED[@]} -gt 0 ] && summary+=" (failed: ${FAILED[*]})"
[ ${#SKIPPED[@]} -gt 0 ] && summary+=" (skipped: ${SKIPPED[*]})"
echo "$summary"
echo "$summary" >"$OUT/summary.txt"
[ $((${#PASSED[@]} + ${#FAILED[@]} + ${#SKIPPED[@]})) -gt 0 ] || echo "warning: no test ran"
[ ${#FAILED[@]} -eq 0 ]
