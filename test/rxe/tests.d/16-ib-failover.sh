#!/bin/bash
# The bridge topology for the failover tests (issue 14, docs/FAILOVER.md
# section 7 item 2): rxe0..rxe3 on veth0..3, whose outer ends br0p0..3 join
# br0 (guest.sh, RXE_TOPO=bridge). Proves the harness, not the feature:
#  (a) all four ports ACTIVE; rail-bench over verbs (4 MiB, every byte
#      checked) works rxe0->rxe1, rxe2->rxe1, rxe2->rxe3, rxe0->rxe3, and
#      its bytes cross both devices' outer links (so the bridge, not lo);
#  (b) rxe_link_flap (lib.sh) takes br0p0 down while an rxe0->rxe1 transfer
#      is in flight: the transfer fails within its bound, rxe0's port is DOWN
#      (sysfs, ibv_devinfo, rdma link) while rxe1..3 stay ACTIVE, rxe2->rxe1
#      still works and a new rxe0->rxe1 transfer does not, with rail-bench
#      nor with ibv_rc_pingpong;
#  (c) br0p0 up: rxe0 ACTIVE again and rxe0->rxe1 works again (both tools).
# The OOB socket of every connection is on lo (NCCL_SOCKET_IFNAME==lo,
# rendezvous on 127.0.0.1), so it never shares fate with a device.
# Prints the port-down detection and port-up times from the events file.
# Skips (77) in the default veth topology: make test-rxe boots once more
# with run.sh --topo bridge --tests 16-ib-failover.
# rxe-timeout: 360
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

if [ "${RXE_TOPO:-veth}" != bridge ]; then
    echo "needs the bridge topology (RXE_TOPO=${RXE_TOPO:-veth}): test/rxe/run.sh --topo bridge --tests 16-ib-failover"
    exit 77
fi
bench=build/rail-bench
[ -x "$bench" ] || { echo "$bench missing: run make all"; exit 1; }
out=$RXE_TEST_OUT
events=$out/events
ready=$out/ready
rm -f "$events" "$ready"
export NCCL_RAIL_TRANSPORT=ib NCCL_SOCKET_IFNAME="=lo" NCCL_RAIL_FAILOVER=0
fails=0
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }
port=18700
MiB=$((1024 * 1024))
spid= cpid=

ctr() { local v; read -r v <"/sys/class/net/$1/statistics/$2" && echo "$v"; }
outer() { local v="RXE_OUTER${1#rxe}"; echo "${!v}"; }

# start NAME SDEV CDEV TOTAL TMO: rail-bench server (the sender) on SDEV,
# client on CDEV, rendezvous 127.0.0.1:$port, both under timeout TMO+10 and
# --timeout TMO; in the background (spid, cpid). Counters of the sender's
# outer link (rx: what veth_S sent) and the receiver's (tx) in s_rx0, c_tx0.
start() {
    local name=$1 sdev=$2 cdev=$3 total=$4 tmo=$5
    port=$((port + 1))
    s_rx0=$(ctr "$(outer "$sdev")" rx_bytes) c_tx0=$(ctr "$(outer "$cdev")" tx_bytes)
    NCCL_IB_HCA="=$sdev" timeout -k 5 $((tmo + 10)) "$bench" --server "127.0.0.1:$port" \
        --timeout "$tmo" >"$out/$name.server" 2>&1 &
    spid=$!
    rxe_wait_listen "$port" 30 || return 1
    NCCL_IB_HCA="=$cdev" timeout -k 5 $((tmo + 10)) "$bench" --client "127.0.0.1:$port" \
        --timeout "$tmo" --total "$total" --msg 1M --verify >"$out/$name.client" 2>&1 &
    cpid=$!
}

# finish NAME SDEV CDEV: wait for both sides; sets src, crc, and sent
# (bytes on the sender's outer link), got (on the receiver's outer link).
finish() {
    local name=$1 sdev=$2 cdev=$3
    wait "$cpid"; crc=$?
    wait "$spid"; src=$?
    sent=$(($(ctr "$(outer "$sdev")" rx_bytes) - s_rx0))
    got=$(($(ctr "$(outer "$cdev")" tx_bytes) - c_tx0))
    sed "s/^/$name server| /" "$out/$name.server" | grep -v '^.*| *$' | tail -n 12
    sed "s/^/$name client| /" "$out/$name.client" | grep -v '^.*| *$' | tail -n 6
    echo "$name: server rc $src, client rc $crc; $(outer "$sdev") carried $sent bytes from $sdev, $(outer "$cdev") $got bytes to $cdev"
}

# xfer_ok SDEV CDEV: 4 MiB SDEV -> CDEV, every byte checked, on the named
# devices, and at least those bytes crossed both outer links.
xfer_ok() {
    local sdev=$1 cdev=$2 name="$1-$2.$port" t0=$EPOCHREALTIME
    start "$name" "$sdev" "$cdev" 4M 30 || { kill "$spid"; wait "$spid"; return 1; }
    finish "$name" "$sdev" "$cdev"
    echo "$name: $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
    local bad=0
    [ "$src" = 0 ] && [ "$crc" = 0 ] || bad=1
    grep -q "^rail-bench: verified: every byte right" "$out/$name.client" || bad=1
    grep -q "^# server (this side.*device 0 = $sdev:1/RoCE" "$out/$name.server" || bad=1
    grep -q "^# client (this side.*device 0 = $cdev:1/RoCE" "$out/$name.client" || bad=1
    [ "$sent" -ge $((4 * MiB)) ] && [ "$got" -ge $((4 * MiB)) ] || bad=1
    return $bad
}

# xfer_fails SDEV CDEV: a new 4 MiB transfer must not complete (bounded by
# --timeout 10), and less than the 4 MiB may reach CDEV's outer link.
xfer_fails() {
    local sdev=$1 cdev=$2 name="$1-$2.$port"
    start "$name" "$sdev" "$cdev" 4M 10 || { kill "$spid"; wait "$spid"; return 1; }
    finish "$name" "$sdev" "$cdev"
    [ "$src" != 0 ] || [ "$crc" != 0 ] || return 1
    ! grep -q "^rail-bench: verified: every byte right" "$out/$name.client" &&
        [ "$got" -lt $((4 * MiB)) ]
}

port_is() {	# DEV WANT: sysfs, ibv_devinfo and rdma link all say WANT (ACTIVE or DOWN)
    local dev=$1 want=$2 s r
    s=$(rxe_port_state "$dev")
    r=$(rdma link show "$dev/1" | sed -n 's/.* state \([A-Z_]*\) .*/\1/p')
    ibv_devinfo -d "$dev" | grep -q "state:[[:space:]]*PORT_$want" || r="$r, ibv_devinfo not PORT_$want"
    echo "$dev: sysfs $s, rdma link $r"
    [ "$s" = "$want" ] && [ "$r" = "$want" ]
}

ev_time() { awk -v e="$1" '$2 == e { print $1; exit }' "$events"; }
ev_diff() { awk -v a="$(ev_time "$1")" -v b="$(ev_time "$2")" 'BEGIN { if (a == "" || b == "") print "?"; else printf "%.3f", b - a }'; }

echo "== (a) four ports ACTIVE, transfers between them"
for d in rxe0 rxe1 rxe2 rxe3; do check port_is "$d" ACTIVE; done
for d in 0 1 2 3; do
    v=RXE_OUTER$d; w=RXE_IP$d
    echo "rxe$d: netdev veth$d ${!w}, outer link ${!v} (rxe_outer_link: $(rxe_outer_link "rxe$d"))"
    check [ "$(rxe_outer_link "rxe$d")" = "${!v}" ]
done
check xfer_ok rxe0 rxe1
check xfer_ok rxe2 rxe1
check xfer_ok rxe2 rxe3
check xfer_ok rxe0 rxe3

echo "== (b) br0p0 down during an rxe0 -> rxe1 transfer (rxe_link_flap, down 30 s)"
down_s=30
rxe_link_flap rxe0 "$ready" "$down_s" "$events" 60 &
fpid=$!
# 2 GiB would take ~20 s: it is in flight when READY comes after 16 MiB.
start inflight rxe0 rxe1 2G 8 || { kill "$spid"; echo "inflight: no server"; exit 1; }
t_start=$EPOCHREALTIME
while kill -0 "$cpid" 2>/dev/null; do
    [ $(($(ctr br0p0 rx_bytes) - s_rx0)) -ge $((16 * MiB)) ] && { echo READY >"$ready"; break; }
    read -rt 0.05 <> <(:)
done
finish inflight rxe0 rxe1
t_end=$EPOCHREALTIME
check [ -f "$ready" ]
check test "$src" != 0 -o "$crc" != 0
check [ "$got" -lt $((2048 * MiB)) ]
echo "in-flight transfer ended $(awk -v a="$(ev_time link-down)" -v b="$t_end" 'BEGIN { if (a == "") print "?"; else printf "%.1f", b - a }') s after the link went down"
check [ -n "$(ev_time port-down)" ]
for d in rxe1 rxe2 rxe3; do check port_is "$d" ACTIVE; done
check port_is rxe0 DOWN
check xfer_ok rxe2 rxe1
check xfer_fails rxe0 rxe1
# The plugin refuses a DOWN port by itself; the path is cut below it too:
# plain verbs (ibv_rc_pingpong, OOB on 127.0.0.1) rxe1 <-> rxe0 fail.
pp=$((port + 10))
check test "$(rxe_pair pingpong-down "$pp" 15 \
    ibv_rc_pingpong -d rxe1 -g "$RXE_GID_INDEX1" -p "$pp" -n 20 -s 4096 -- \
    ibv_rc_pingpong -d rxe0 -g "$RXE_GID_INDEX0" -p "$pp" -n 20 -s 4096 127.0.0.1 |
    tee /dev/stderr | tail -n1)" != "pingpong-down: ok"
# The checks above are only meaningful while the link was still down.
check [ -z "$(ev_time link-up)" ]

echo "== (c) br0p0 up again"
wait "$fpid"
check [ $? = 0 ]
check port_is rxe0 ACTIVE
check xfer_ok rxe0 rxe1
t_ok=$EPOCHREALTIME
# ... and the same ibv_rc_pingpong that failed while down works now.
pp=$((pp + 1))
check rxe_pair pingpong-up "$pp" 60 \
    ibv_rc_pingpong -d rxe1 -g "$RXE_GID_INDEX1" -p "$pp" -n 20 -s 4096 -- \
    ibv_rc_pingpong -d rxe0 -g "$RXE_GID_INDEX0" -p "$pp" -n 20 -s 4096 127.0.0.1
cat "$events"

dn=$(ev_diff link-down port-down) up=$(ev_diff link-up port-active)
back=$(awk -v a="$(ev_time link-up)" -v b="$t_ok" 'BEGIN { if (a == "") print "?"; else printf "%.1f", b - a }')
echo "times: port DOWN ${dn} s after ip link set br0p0 down; ACTIVE ${up} s after ip link set br0p0 up; rxe0->rxe1 transfer done ${back} s after up"
echo "times: $dn $up $back" >"$out/times"

[ "$fails" -eq 0 ] || { echo "bridge topology: $fails check(s) failed"; exit 1; }
echo "bridge topology: all checks passed"
