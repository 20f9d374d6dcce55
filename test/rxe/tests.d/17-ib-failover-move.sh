#!/bin/bash
# Failover of verbs comms on real rdma-core (issue 14, docs/FAILOVER.md
# section 7 item 2), in the bridge topology (16-ib-failover.sh proves it):
# rail-conformance's failover-loop between two processes -- role A (the
# receiver) with NCCL_IB_HCA==rxe1,rxe3, role B (the sender) with
# ==rxe0,rxe2, so each uses the first and falls back on the second -- mixed
# sizes from 8 B to 2 MiB, every byte and guard checked, for
# RAIL_CONF_FAILOVER_SECONDS and at least SETTLE_S after the fault ended
# (RAIL_CONF_FAILOVER_UNTIL); the handshake sockets on lo. Meanwhile
# rxe_link_flap takes one device's outer link down and up again.
#   sender:   rxe0 down 3 s: B moves rxe0 -> rxe2, A rebuilds on rxe1; after
#             the hold-down (NCCL_RAIL_FAILOVER_HOLDDOWN=3) B moves back;
#   receiver: rxe1 down 3 s: A moves rxe1 -> rxe3, then back;
#   fused:    each role fuses its two devices (--fuse 0,1: B rxe0+rxe2, A
#             rxe1+rxe3); rxe0 down 3 s: B's member on rxe0 moves to its
#             surviving member's device rxe2, A's members are rebuilt in place;
#             then back;
#   stall:    rxe0's bridge port stops forwarding for 12 s (bridge link set
#             ... state 0: no carrier change, no PORT_ERR; rxe retries for
#             ever at NCCL_IB_RETRY_CNT=7), NCCL_RAIL_IB_STALL_TIMEOUT=2: the
#             stall watchdog moves B to new QPs on rxe0, which stall too, and
#             the second stall within 60 s takes it off rxe0 to rxe2;
#   off:      NCCL_RAIL_FAILOVER=0, rxe0 down: the roles fail (the PORT_ERR
#             WARN), as without failover.
# Every case must PASS in both roles with no failed request (failover-loop
# fails on any error). Prints the time to recover (the link going down to
# the end of the slowest round, which holds the move) and the move lines.
# Skips (77) in the default topology; make test-rxe runs it in the bridge
# boot.
# rxe-timeout: 700
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

if [ "${RXE_TOPO:-veth}" != bridge ]; then
    echo "needs the bridge topology: test/rxe/run.sh --topo bridge --tests 17-ib-failover-move"
    exit 77
fi
conf=build/rail-conformance
plugin=build/libnccl-net-rail.so
[ -x "$conf" ] || { echo "$conf missing: run make tests"; exit 1; }
out=$RXE_TEST_OUT
export NCCL_RAIL_TRANSPORT=ib NCCL_SOCKET_IFNAME="=lo" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET
export RAIL_CONF_FAILOVER_SECONDS=${FAILOVER_SECONDS:-14} NCCL_RAIL_FAILOVER_HOLDDOWN=3
SETTLE_S=8	# after the fault: hold-down 3 s, the move back, rounds after it
fails=0
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }
port=18790
conf_extra=()	# more rail-conformance arguments (the fused case)
fault=rxe_link_flap	# what run does to the device: or path_cut

# path_cut DEV READY_FILE DOWN_S EVENTS_FILE [READY_TIMEOUT_S]: as
# rxe_link_flap, but the bridge stops forwarding DEV's outer port (state
# disabled) instead of the link going down: the port stays ACTIVE, the path
# is gone (a fault behind the switch port); events link-down and link-up.
path_cut() {
    local dev=$1 ready=$2 down_s=$3 events=$4 rtmo=${5:-120} outer deadline
    outer=$(rxe_outer_link "$dev") || return 1
    deadline=$((SECONDS + rtmo))
    until [ -f "$ready" ] && grep -qx 'READY' "$ready"; do
        [ $SECONDS -lt $deadline ] || { echo "$EPOCHREALTIME ready-timeout $dev" >>"$events"; return 1; }
        _rxe_nap 0.05
    done
    echo "$EPOCHREALTIME ready $dev $outer" >>"$events"
    echo "$EPOCHREALTIME link-down $dev $outer (bridge port disabled)" >>"$events"
    bridge link set dev "$outer" state 0 || return 1
    _rxe_nap "$down_s"
    echo "$EPOCHREALTIME link-up $dev $outer (bridge port forwarding) $(rxe_port_state "$dev")" >>"$events"
    bridge link set dev "$outer" state 3
}

# run NAME FAULT_DEV DOWN_S [ENV...]: both roles and the link flap; sets ra, rb (exit codes).
run() {
    local name=$1 dev=$2 down=$3 ev=$out/$1.events ready=$out/$1.ready apid bpid fpid
    local until=$out/$1.until
    shift 3
    port=$((port + 1))
    rm -f "$ev" "$ready" "$out/$name.flap" "$until"
    env "$@" NCCL_IB_HCA="=rxe1,rxe3" RAIL_CONF_FAILOVER_UNTIL="$until" \
        timeout -k 5 200 "$conf" --plugin "$plugin" --abi 12 \
        "${conf_extra[@]}" --scenario failover-loop --timeout 150 -v \
        --ctl-listen "127.0.0.1:$port" \
        --event-file "$ev" >"$out/$name.a" 2>&1 &
    apid=$!
    rxe_wait_listen "$port" 30
    env "$@" NCCL_IB_HCA="=rxe0,rxe2" timeout -k 5 200 "$conf" --plugin "$plugin" --abi 12 \
        "${conf_extra[@]}" --scenario failover-loop --timeout 150 -v \
        --ctl-connect "127.0.0.1:$port" \
        >"$out/$name.b" 2>&1 &
    bpid=$!
    ( for _ in $(seq 1200); do grep -q READY "$ev" 2>/dev/null && break; sleep 0.1; done
      echo READY >"$ready" ) &
    # A stops no sooner than SETTLE_S after the fault ended (the port ACTIVE
    # again): the hold-down and the move back fit in it even when the guest
    # stalled and the port's events came late (CI once saw one 50 s late).
    ( "$fault" "$dev" "$ready" "$down" "$out/$name.flap" 150; rc=$?
      _rxe_nap "$SETTLE_S"; : >"$until"; exit $rc ) &
    fpid=$!
    wait "$apid"; ra=$?
    wait "$bpid"; rb=$?
    wait "$fpid" || echo "$name: the link flap did not complete (see below)"
    echo "$name: role A exit $ra, role B exit $rb"
    cat "$out/$name.flap" 2>/dev/null | sed "s/^/$name flap| /"
    grep -h "^PASS\|^FAIL\|^SKIP\|slowest" "$out/$name.a" "$out/$name.b" | sed "s/^/$name| /"
    grep -h "moved\|no other usable\|went down\|ACTIVE again\|completion error" \
        "$out/$name.a" "$out/$name.b" | cut -c1-300 | sed "s/^/$name log| /"
}

# recovery NAME: from the link going down to the end of the first slow round
# after it (failover-loop's SLOW lines: rounds over 3x the median), and the
# move back: the first slow round that started after the link came up.
recovery() {
    awk -v n="$1" '
        FNR == NR && $2 == "link-down" && !down { down = $1 }
        FNR == NR && $2 == "link-up" && !up { up = $1 }
        FNR != NR && $3 == "SLOW" {
            for (i = 4; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            if (!rec && v["end"] > down) { rec = v["end"] - down; recms = v["ms"] }
            if (!back && v["start"] >= up) { back = v["ms"] }
        }
        FNR != NR && $3 == "DONE" { for (i = 4; i <= NF; i++) { split($i, kv, "="); d[kv[1]] = kv[2] } }
        END {
            if (!rec) { print n ": time to recover: unknown (no slow round after the link went down)"; exit }
            printf "%s: time to recover (link down to the end of the first slow round): %.2f s (that round %.0f ms, median round %s ms); move-back round %s ms\n", n, rec, recms, d["median_ms"], back ? back : "?"
        }' "$out/$1.flap" "$out/$1.events"
}

has() { grep -q -- "$2" "$out/$1.a" "$out/$1.b"; }

echo "== sender's port: rxe0 down 3 s"
run sender rxe0 3
check [ "$ra" = 0 ] && check [ "$rb" = 0 ]
check has sender "(send comm) moved from rxe0:1 to rxe2:1"
check has sender "(receive comm) moved from rxe1:1 to rxe1:1"
check has sender "(send comm) moved back from rxe2:1 to rxe0:1"
recovery sender

echo "== receiver's port: rxe1 down 3 s"
run receiver rxe1 3
check [ "$ra" = 0 ] && check [ "$rb" = 0 ]
check has receiver "(receive comm) moved from rxe1:1 to rxe3:1"
check has receiver "(send comm) moved from rxe0:1 to rxe0:1"
check has receiver "(receive comm) moved back from rxe3:1 to rxe1:1"
recovery receiver

echo "== fused devices: B rxe0+rxe2, A rxe1+rxe3; rxe0 down 3 s"
conf_extra=(--fuse 0,1)
run fused rxe0 3
conf_extra=()
check [ "$ra" = 0 ] && check [ "$rb" = 0 ]
check has fused "(send comm) moved from rxe0:1+rxe2:1 to rxe2:1+rxe2:1"
check has fused "(receive comm) moved from rxe1:1+rxe3:1 to rxe1:1+rxe3:1"
check has fused "(send comm) moved back from rxe2:1+rxe2:1 to rxe0:1+rxe2:1"
recovery fused

echo "== stall: rxe0's bridge port disabled 12 s, no port event"
fault=path_cut
RAIL_CONF_FAILOVER_SECONDS=22 run stall rxe0 12 NCCL_RAIL_IB_STALL_TIMEOUT=2
fault=rxe_link_flap
check [ "$ra" = 0 ] && check [ "$rb" = 0 ]
check has stall "none polled for"
check has stall "(send comm) moved from rxe0:1 to rxe0:1"
check has stall "(send comm) moved from rxe0:1 to rxe2:1"
recovery stall

echo "== NCCL_RAIL_FAILOVER=0: rxe0 down, the comm fails as before"
RAIL_CONF_FAILOVER_SECONDS=8 run off rxe0 2 NCCL_RAIL_FAILOVER=0
check [ "$ra" != 0 ] || check [ "$rb" != 0 ]
check has off "went down (async event PORT_ERR)"
! has off "moved from" || { echo "FAILED: a move with NCCL_RAIL_FAILOVER=0"; fails=$((fails + 1)); }

[ "$fails" = 0 ] && echo "failover-move: all checks passed" || echo "failover-move: $fails check(s) failed"
exit $((fails > 0))
