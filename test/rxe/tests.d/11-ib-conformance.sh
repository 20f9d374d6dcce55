#!/bin/bash
# The conformance suite over the verbs transport: role A on rxe0, role B on
# rxe1 (ABIs 12 and 6), both roles on rxe0 (v12), then both on a fused virtual
# NIC of rxe0+rxe1 (makeVDevice), then
# one device with 2 QPs per connection and the data split over them, then
# with the eager ring off (every message through a clear-to-send), then
# with adaptive routing forced on (rxe is RoCE: off by default) and a low
# threshold, so that every message above 1 KiB ends with a zero-byte write
# with immediate, then
# with each protocol of the eager ring forced (NCCL_RAIL_IB_EAGER_ORDER:
# rxe does not implement ibv_query_qp_data_in_order, so libibverbs answers
# 0 and the default is already the order-safe one; inorder is correct on
# rxe, which places each write in order); last, subnet-aware routing with
# each device on a subnet of its own.
# The profiler scenario (NCCL profiler events, v10+) runs in the first three
# runs with every scenario, and again with data split over 2 QPs (an event
# per QP of the set) and with the eager ring off (every receive posts WRs).
# rxe-timeout: 1500
set -uo pipefail

conf=build/rail-conformance
plugin=build/libnccl-net-rail.so
[ -x "$conf" ] && [ -f "$plugin" ] || { echo "$conf or $plugin missing: run make all"; exit 1; }
export NCCL_RAIL_TRANSPORT=ib

fails=0
run() {
    local t0=$SECONDS
    echo "== $*"
    if ! timeout 600 "$@"; then
        echo "FAILED: $*"
        fails=$((fails + 1))
    fi
    echo "== $(($SECONDS - t0)) s"
}

# The newest and the oldest ABI: the shims between convert structs on NCCL's
# thread and are the same for every transport (make test-conformance runs
# every ABI over TCP); on rxe the verbs transport is what is under test.
run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 64M --abi 12
# ABI 6 and one device for both roles: up to 4 MiB, the traffic and misuse
# scenarios (the peer failure, reload and finalize scenarios, which wait on
# their time bounds, test the transport, not the ABI or the device pair: the
# first run has them).
traffic=properties,sizes,inflight-32,grouped-recv,recv-larger,send-larger,many-comms,bidirectional
traffic=$traffic,close-inflight,listen-many,regmr-thread,iflush,misuse,misuse-closed
run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 4M --abi 6 --scenario "$traffic"
run "$conf" --plugin "$plugin" --dev 0 --peer-dev 0 --max-size 4M --abi 12 --scenario "$traffic"
run "$conf" --plugin "$plugin" --fuse 0,1 --max-size 64M --abi 12
NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1 \
    run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 16M --abi 12 \
    --scenario sizes,inflight-32,grouped-recv,recv-larger,send-larger,bidirectional,profiler
NCCL_RAIL_IB_EAGER=0 \
    run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 16M --abi 12 \
    --scenario sizes,inflight-32,grouped-recv,recv-larger,send-larger,bidirectional,close-inflight,profiler
NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=1024 \
    run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 16M --abi 12 \
    --scenario sizes,inflight-32,grouped-recv,recv-larger,send-larger,bidirectional
for order in safe inorder; do
    NCCL_RAIL_IB_EAGER_ORDER=$order \
        run "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --max-size 1M --abi 12 \
        --scenario sizes,inflight-32,grouped-recv,recv-larger,send-larger,bidirectional,many-comms
done
# Subnet-aware routing (NCCL_IB_SUBNET_AWARE_ROUTING) with /32 subnets, so
# that each rxe device is a subnet of its own: role A, given rxe0, must
# connect from rxe1, the device on the listener's subnet, and say so.
out=$(NCCL_IB_SUBNET_AWARE_ROUTING=1 NCCL_IB_SUBNET_PREFIX_LEN=32 NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=NET timeout 600 "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 \
    --max-size 1M --abi 12 --scenario sizes,bidirectional 2>&1)
rc=$?
printf '%s\n' "$out" >"${RXE_TEST_OUT:-/tmp}/subnet-aware.log"
echo "== subnet-aware routing, /32: rc $rc"
printf '%s\n' "$out" | grep -F "is not on the peer's subnet" | head -2
if [ $rc -ne 0 ] || ! printf '%s\n' "$out" | grep -F "is not on the peer's subnet" |
    grep -q "using device 1 (rxe1"; then
    echo "FAILED: subnet-aware routing: rc $rc, or no line moving the connection to rxe1"
    printf '%s\n' "$out" | grep -E "WARN|subnet" | head -5
    fails=$((fails + 1))
fi
exit $((fails > 0))
