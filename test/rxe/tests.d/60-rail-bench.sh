#!/bin/bash
# rail-bench --server/--client over verbs between the two rxe devices: the
# server on rxe0 (veth0, 192.0.2.1), the client on rxe1 (veth1, 192.0.2.2),
# NCCL_RAIL_TRANSPORT=ib; 256 MiB with every byte checked, and a header
# naming the ib transport and both devices. Then a flipped byte must be
# caught on both sides (the check can fail).
# rxe-timeout: 420
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

bench=build/rail-bench
[ -x "$bench" ] || { echo "$bench missing: run make all"; exit 1; }
total=${RXE_TEST_BENCH_TOTAL:-256M}
out=$RXE_TEST_OUT
fails=0
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }

# run NAME PORT CLIENT_ARGS...: server on rxe0, client on rxe1; sets src, crc.
run() {
    local name=$1 port=$2 spid
    shift 2
    NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA="=$RXE_DEV0" NCCL_SOCKET_IFNAME="=$RXE_NETDEV0" \
        timeout -k 5 180 "$bench" --server "$RXE_IP0:$port" --timeout 120 \
        >"$out/$name.server" 2>&1 &
    spid=$!
    NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA="=$RXE_DEV1" NCCL_SOCKET_IFNAME="=$RXE_NETDEV1" \
        timeout -k 5 180 "$bench" --client "$RXE_IP0:$port" --timeout 120 "$@" \
        >"$out/$name.client" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    sed "s/^/$name server| /" "$out/$name.server"
    sed "s/^/$name client| /" "$out/$name.client"
}

t0=$SECONDS
run exact 18660 --total "$total" --msg 4M --verify
echo "exact: ${total} took $((SECONDS - t0)) s (server rc $src, client rc $crc)"
check [ "$src" = 0 ]
check [ "$crc" = 0 ]
for side in server client; do
    f=$out/exact.$side
    check grep -q "^# rail-bench (nccl-net-rail $(cat VERSION))" "$f"
    check grep -q "^# transport: ib, chosen because NCCL_RAIL_TRANSPORT=ib" "$f"
    check grep -q "^rail-bench: verified: every byte right" "$f"
done
check grep -q "^# server (this side.*device 0 = $RXE_DEV0:1/RoCE" "$out/exact.server"
check grep -q "^# client (.*device 0 = $RXE_DEV1:1/RoCE" "$out/exact.server"
check grep -q "^# client (this side.*device 0 = $RXE_DEV1:1/RoCE" "$out/exact.client"
check grep -q "^# server ($RXE_IP0:18660, .*device 0 = $RXE_DEV0:1/RoCE" "$out/exact.client"

# The check can fail: one flipped byte, reported with its offset on both sides.
run corrupt 18661 --total 16M --msg 1M --verify --corrupt 5000000
check [ "$src" = 1 ]
check [ "$crc" = 1 ]
check grep -q "DATA MISMATCH: 1 of the messages .* offset 5000000 " "$out/corrupt.client"
check grep -q "DATA MISMATCH at the peer: 1 wrong messages, first wrong byte at offset 5000000" \
    "$out/corrupt.server"

[ "$fails" -eq 0 ] || { echo "rail-bench over rxe: $fails check(s) failed"; exit 1; }
echo "rail-bench over rxe: all checks passed ($((SECONDS - t0)) s)"
