#!/bin/bash
# rail-check over verbs between the two rxe devices: one process per device
# (NCCL_IB_HCA, NCCL_SOCKET_IFNAME), the rendezvous on 127.0.0.1,
# NCCL_RAIL_TRANSPORT=ib. Checks:
#   healthy: rxe0 <-> rxe1 passes (latency, bandwidth), both GIDs RoCE v2 on
#     192.0.2.0/24, exit 0 on both sides;
#   subnet: veth1 moved to 198.51.100.2/24 (rxe1's GID follows): the pair
#     named as on different subnets, with both GIDs, exit 1;
#   linkdown: veth1 taken down after the processes met (--hook): the pair
#     fails at a named step within the time bound, exit 1;
#   config: NCCL_IB_TC differs between the two: named, exit 1.
# The guest's topology is restored after each change (veth1 192.0.2.2 up,
# the policy routes of guest.sh, rxe1's GID); the test fails if it cannot be.
# rxe-timeout: 420
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

rc=build/rail-check
[ -x "$rc" ] || { echo "$rc missing: run make all"; exit 1; }
out=$RXE_OUT
port=18960
fails=0
new_ip=198.51.100.2
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }

wait_for() {	# SECONDS DESCRIPTION COMMAND...: poll every 0.1 s
    local n=$(($1 * 10)) what=$2
    shift 2
    while ((n-- > 0)); do
        "$@" && return 0
        sleep 0.1
    done
    echo "$what: not within the time" >&2
    return 1
}
port_is() { grep -q "$2" "/sys/class/infiniband/$1/ports/1/state"; }

# run NAME [SERVER_ARGS] -- [CLIENT_ARGS]: rxe0's process serves, rxe1's connects.
run() {
    local name=$1 sargs=() cargs=() t0=$SECONDS spid
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA="=$RXE_DEV0" NCCL_SOCKET_IFNAME="=$RXE_NETDEV0" \
        timeout -k 5 150 "$rc" --server "127.0.0.1:$port" --timeout 8 --meet-timeout 60 \
        --lat-iters 50 "${sargs[@]}" >"$out/$name.a" 2>&1 &
    spid=$!
    env NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA="=$RXE_DEV1" NCCL_SOCKET_IFNAME="=$RXE_NETDEV1" \
        ${B_ENV:-} timeout -k 5 150 "$rc" --connect "127.0.0.1:$port" --timeout 8 \
        --meet-timeout 60 --lat-iters 50 "${cargs[@]}" >"$out/$name.b" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    secs=$((SECONDS - t0))
    port=$((port + 1))
    sed "s/^/$name a| /" "$out/$name.a"
    sed "s/^/$name b| /" "$out/$name.b"
    echo "70-rail-check: $name: server exit $src, client exit $crc, ${secs} s"
}

# guest.sh's topology: veth1 up at 192.0.2.2 with the policy routes, rxe1 ACTIVE with its GID.
restore() {
    ip link set veth1 up
    ip addr del "$new_ip/24" dev veth1 2>/dev/null
    ip addr replace 192.0.2.2/24 dev veth1
    ip route replace 192.0.2.2/32 dev veth0 src 192.0.2.1 table 101
    ip route replace 192.0.2.1/32 dev veth1 src 192.0.2.2 table 102
    wait_for 10 "rxe1 ACTIVE" port_is rxe1 ACTIVE &&
        wait_for 10 "rxe0 ACTIVE" port_is rxe0 ACTIVE &&
        wait_for 10 "GID of 192.0.2.2 on rxe1" rxe_ipv4_gid_index rxe1 192.0.2.2 >/dev/null &&
        ! rxe_ipv4_gid_index rxe1 "$new_ip" >/dev/null
}
restore_or_fail() {
    restore || { echo "could not restore veth1 192.0.2.2 and rxe1's GID"; rxe_gid_table rxe1; exit 1; }
}
trap 'restore >/dev/null 2>&1' EXIT

dev0="[^ ]+#0:$RXE_DEV0(:1)?" dev1="[^ ]+#1:$RXE_DEV1(:1)?"

# 1. Healthy.
run healthy --
check [ "$src" = 0 ] && check [ "$crc" = 0 ]
check grep -q "^# rank 0: .* transport ib (NCCL_RAIL_TRANSPORT=ib)" "$out/healthy.a"
check grep -Eq "^#   \[0\] $RXE_DEV0(:1)? port 1 RoCE GID ::ffff:192\.0\.2\.1 \(index [0-9]+, RoCEv2\) subnet 192\.0\.2\.0/24 MTU [0-9]+" \
    "$out/healthy.a"
check grep -Eq "^#   \[0\] $RXE_DEV1(:1)? port 1 RoCE GID ::ffff:192\.0\.2\.2 \(index [0-9]+, RoCEv2\) subnet 192\.0\.2\.0/24" \
    "$out/healthy.a"
check grep -Eq "^$dev0 +\. +[0-9.]+us [0-9.]+GB/s *$" "$out/healthy.a"
check grep -Eq "^$dev1 +[0-9.]+us [0-9.]+GB/s +\. *$" "$out/healthy.a"
check grep -q "^rail-check: all good: 1 device pair(s) tested, 0 failed" "$out/healthy.a"

# 2. One GID on another subnet.
ip addr del 192.0.2.2/24 dev veth1 && ip addr add "$new_ip/24" dev veth1 &&
    wait_for 10 "GID of $new_ip on rxe1" rxe_ipv4_gid_index rxe1 "$new_ip" >/dev/null ||
    { echo "cannot move veth1 to $new_ip"; restore_or_fail; exit 1; }
run subnet --
restore_or_fail
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -Eq "^FAIL $dev0 \(GID ::ffff:192\.0\.2\.1\) <-> $dev1 \(GID ::ffff:198\.51\.100\.2\): subnet: GIDs on different subnets: .*\(192\.0\.2\.0/24\) .*\(198\.51\.100\.0/24\)" \
    "$out/subnet.a"
check grep -q "on a routed fabric pass --routed" "$out/subnet.a"
check [ "$secs" -lt 120 ]

# 3. The link goes down after the processes met.
run linkdown --hook "ip link set veth1 down; for i in \$(seq 100); do grep -q DOWN /sys/class/infiniband/rxe1/ports/1/state && break; sleep 0.1; done" --
restore_or_fail
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -Eq "^FAIL $dev0 \(GID ::ffff:192\.0\.2\.1\) <-> $dev1 \(GID ::ffff:192\.0\.2\.2\): [a-z]+: " \
    "$out/linkdown.a"
check grep -q "^rail-check: FAILED: 1 device pair(s) tested, 1 failed" "$out/linkdown.a"
check [ "$secs" -lt 120 ]

# 4. A setting that must agree differs.
B_ENV="NCCL_IB_TC=106" run config --
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -q "^FAIL config: NCCL_IB_TC differs: -1 on .* (rank 0), 106 on .* (rank 1): it changes the wire" \
    "$out/config.a"

rxe_gid_table rxe1
[ "$fails" -eq 0 ] || { echo "rail-check over rxe: $fails check(s) failed"; exit 1; }
echo "rail-check over rxe: all checks passed"
