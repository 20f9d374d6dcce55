#!/bin/bash
# rail-bench over the verbs transport side by side with perftest, in one
# guest boot, on one device (rxe0 to itself), alternating, twice each.
#   test/rxe/run.sh --cmd test/rxe/bench.sh
# Prints perftest's own lines and rail-bench's table; docs/PERFORMANCE.md
# keeps the figures.
set -uo pipefail
. "$RXE_HARNESS/lib.sh"
dev=${BENCH_DEV:-rxe0} ip=${BENCH_IP:-$RXE_IP0}
g=$(rxe_ipv4_gid_index "$dev" "$ip") || { echo "no IPv4 GID on $dev"; exit 1; }
export NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA="=$dev"
port=18700
for round in 1 2; do
    for s in 65536 1048576; do
        port=$((port + 1))
        rxe_pair "write_bw_$s" $port 120 \
            ib_write_bw -d "$dev" -x "$g" -p $port -s $s -n 2000 -F --report_gbits -- \
            ib_write_bw -d "$dev" -x "$g" -p $port -s $s -n 2000 -F --report_gbits "$ip" \
            | grep -E "client\| +[0-9]+ +[0-9]+"
        echo "rail-bench bw $s:"
        timeout 120 build/rail-bench -B -b $s -e $s -W 32 -n 2000 -t 5 | tail -1
    done
    port=$((port + 1))
    rxe_pair write_lat $port 120 \
        ib_write_lat -d "$dev" -x "$g" -p $port -s 8 -n 5000 -F -- \
        ib_write_lat -d "$dev" -x "$g" -p $port -s 8 -n 5000 -F "$ip" \
        | grep -E "client\| +8 +"
    echo "rail-bench lat 8:"
    timeout 120 build/rail-bench -L -b 8 -e 8 -n 5000 | tail -1
done
