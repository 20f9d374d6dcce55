#!/bin/bash
# Instructions per small message on the verbs data path, counted by
# callgrind on the fake provider (test/perf/pingpong.c): noise-free, so a
# change of the hot path can be judged before a guest boot.
#   test/perf/instr.sh [SIZE]     (default 8 bytes; needs valgrind)
# For each eager ring protocol (order-safe: write with immediate, read after
# its receive completion; in-order: one write, its trailer polled), prints
# per message and step (see pingpong.c) the plugin's instructions, and the
# fake provider's apart (a real provider's differ).
set -euo pipefail
cd "$(dirname "$0")/../.."
size=${1:-8}
command -v valgrind >/dev/null || { echo "instr.sh: needs valgrind (apt-get install valgrind)"; exit 2; }
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
printf '%-8s %-12s %8s %8s\n' order step plugin fake
for order in safe inorder; do
    export NCCL_RAIL_IB_EAGER_ORDER=$order
    for step in step_send step_detect step_idle step_recv; do
        read -r p1 f1 < <(count $step 200)
        read -r p2 f2 < <(count $step 1200)
        # two messages per round trip: 2000 steps between the runs
        printf '%-8s %-12s %8d %8d\n' $order ${step#step_} $(((p2 - p1) / 2000)) $(((f2 - f1) / 2000))
    done
done
