#!/bin/bash
# Instructions per small message on the verbs data path, counted by
# callgrind on the fake provider (test/perf/pingpong.c): noise-free, so a
# change of the hot path can be judged before a guest boot.
#   test/perf/instr.sh [SIZE]     (default 8 bytes; needs valgrind)
#   test/perf/instr.sh --check    (8 bytes; fails when a step exceeds its
#                                  limit in test/perf/instr-limits: make test)
# For each eager ring protocol (order-safe: write with immediate, read after
# its receive completion; in-order: one write, its trailer polled), prints
# per message and step (see pingpong.c) the plugin's instructions, and the
# fake provider's apart (a real provider's differ).
set -euo pipefail
cd "$(dirname "$0")/../.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
size=${1:-8}
if ! command -v valgrind >/dev/null; then
    if [ $check = 1 ] && [ "${RAIL_REQUIRE_VALGRIND:-0}" != 1 ]; then
        echo "SKIP instr.sh --check: valgrind is not installed (apt-get install valgrind)"
        exit 0
    fi
    echo "instr.sh: needs valgrind (apt-get install valgrind)"
    exit 2
fi
make -s build/test/perf/pingpong build/test/fakeverbs/libfakeverbs.so
tmp=$(mktemp -d /tmp/rail-instr-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export NCCL_IBVERBS_LIB=$PWD/build/test/fakeverbs/libfakeverbs.so
export RAIL_FAKEVERBS_CONF=$PWD/test/fakeverbs/conf/roce-2dev.conf
export RAIL_FAKEVERBS_SYSFS=$tmp NCCL_RAIL_SYSFS_ROOT=$tmp NCCL_SOCKET_IFNAME=lo NCCL_RAIL_TRANSPORT=ib
# count STEP ITERS: "plugin fake" instructions in STEP over a run of ITERS round trips
count() {
    valgrind -q --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="$1" \
        build/test/perf/pingpong "$2" "$size" >/dev/null
    callgrind_annotate --threshold=100 "$tmp/cg" | awk '
        /PROGRAM TOTALS/ { t = $1; gsub(",", "", t) }
        /^ *[0-9,]+ .*\[.*libfakeverbs/ { n = $1; gsub(",", "", n); f += n }
        END { print t - f, f + 0 }'
}
limit() { awk -v o="$1" -v s="$2" '$1 == o && $2 == s { print $3 }' test/perf/instr-limits; }
printf '%-8s %-12s %8s %8s %8s\n' order step plugin fake limit
over=0
for order in safe inorder; do
    export NCCL_RAIL_IB_EAGER_ORDER=$order
    for step in step_send step_detect step_idle step_recv; do
        read -r p1 f1 < <(count $step 200)
        read -r p2 f2 < <(count $step 1200)
        # two messages per round trip: 2000 steps between the runs
        p=$(((p2 - p1) / 2000)) f=$(((f2 - f1) / 2000)) lim=$(limit $order ${step#step_})
        printf '%-8s %-12s %8d %8d %8s' $order ${step#step_} $p $f "${lim:--}"
        if [ $check = 1 ] && [ -n "$lim" ] && [ $p -gt "$lim" ]; then
            printf '  OVER'
            over=1
        fi
        printf '\n'
    done
done
if [ $check = 1 ]; then
    if [ $over = 1 ]; then
        echo "instr.sh --check: a step of the verbs data path exceeds its limit (test/perf/instr-limits)"
        exit 1
    fi
    echo "instr.sh --check: every step within its limit"
fi
