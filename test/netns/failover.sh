#!/bin/bash
# TCP failover across interfaces (issue 14, docs/FAILOVER.md section 6):
# two network namespaces joined by three veth pairs, one for rail-bench's
# rendezvous and two data interfaces, both named in NCCL_SOCKET_IFNAME.
#
#   test/netns/failover.sh BUILD_DIR        (make test-netns)
#   CASES="5 6" test/netns/failover.sh build  (only those cases)
#
# As root: namespaces rfA-<pid> / rfB-<pid>; rendezvous 10.77.95.1 <-> .2,
# data 0 10.77.96.1 <-> .2 (faa0/fab0), data 1 10.77.97.1 <-> .2 (faa1/fab1), data 2
# 10.77.98.1 <-> .2 (faa2/fab2) through a bridge in a third namespace rfC-<pid>.
# rail-bench --server in A sends, --client in B receives, every byte checked
# (--verify: a window of 8 messages whose send buffers are refilled as soon
# as each send completes). Checks:
#   1. the active data interface taken down in A mid-transfer, up 3 s later:
#      both exit 0, every byte right, and each side logs one move line naming
#      both interfaces; the time from the fault to the move is printed;
#   2. the same with NCCL_RAIL_FAILOVER=0: the transfer fails (named error),
#      no move line (today's behaviour);
#   3. a single data interface configured: a healthy run moves nothing and
#      starts no rescue listener; the same fault fails it as today;
#   4. the sender killed mid-transfer with failover on: the receiver fails
#      at once (end of file means the peer exited), no move;
#   5. move back (NCCL_RAIL_FAILOVER_HOLDDOWN=2): the interface up again, the
#      comm goes back to it after 2 s (a move-back line on both sides, faa0's
#      byte counter grows again), every byte right; and a flapping link (up for
#      1 s, down, up): no move back during the short run, one after the last;
#   6. "please move": B's interface taken down behind a bridge (A keeps its
#      carrier and sees nothing): B asks A to move, A moves, every byte right;
#   7. case 1 with a stranger holding an idle connection to every rescue port
#      of both processes (opened before the fault, never sending a byte): the
#      move happens as in case 1, each stranger is dropped with an INFO line
#      naming its address (no WARN), and both processes exit before the strangers
#      give up (finalize returns).
# Everything is removed on every exit. Not root, or no `ip netns`: SKIP.
set -uo pipefail

build=${1:-build}
bench=$build/rail-bench
nsa=rfA-$$ nsb=rfB-$$ nsc=rfC-$$
out=$(mktemp -d /tmp/rail-failover.XXXXXX)
port=18991
fails=0
stranger_pids=

skip() { echo "SKIP: failover netns: $*"; exit 0; }
[ -x "$bench" ] || { echo "failover netns: $bench missing: run make" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
command -v ip >/dev/null || skip "no ip(8) (package iproute2)"

cleanup() {
    [ -n "${KEEP:-}" ] && cp -r "$out" "$KEEP"
    [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null
    [ -n "$stranger_pids" ] && kill $stranger_pids 2>/dev/null
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null
    ip netns del "$nsc" 2>/dev/null
    rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsa" 2>"$out/err" || skip "ip netns add failed: $(cat "$out/err")"
ip netns add "$nsb" || { echo "failover netns: ip netns add $nsb failed"; exit 1; }
veth() {
    ip link add "$1" netns "$nsa" type veth peer name "$2" netns "$nsb" &&
        ip -n "$nsa" addr add "$3.1/24" dev "$1" && ip -n "$nsb" addr add "$3.2/24" dev "$2" &&
        ip -n "$nsa" link set "$1" up && ip -n "$nsb" link set "$2" up
}
carrier() { ip -n "$1" link show "$2" | grep -q LOWER_UP; }
wait_carrier() {
    for _ in $(seq 50); do
        carrier "$nsa" faa0 && carrier "$nsa" faa1 && carrier "$nsb" fab0 &&
            carrier "$nsb" fab1 && carrier "$nsa" faa2 && carrier "$nsb" fab2 && return 0
        sleep 0.1
    done
    echo "failover netns: the veth pairs have no carrier after 5 s"; return 1
}
# A third data path through a bridge in namespace C: faa2 (A) - br0 - fab2 (B). Taking fab2
# down in B takes the carrier of its bridge port only; A's faa2 keeps running, so A sees nothing.
# Made before faa1, so that faa2 comes first (device 0) in "faa2,faa1" (interfaces in kernel order).
bridged() {
    ip netns add "$nsc" && ip -n "$nsc" link add br0 type bridge &&
        ip link add faa2 netns "$nsa" type veth peer name ca2 netns "$nsc" &&
        ip link add fab2 netns "$nsb" type veth peer name cb2 netns "$nsc" &&
        ip -n "$nsc" link set ca2 master br0 && ip -n "$nsc" link set cb2 master br0 &&
        ip -n "$nsc" link set ca2 up && ip -n "$nsc" link set cb2 up &&
        ip -n "$nsc" link set br0 up &&
        ip -n "$nsa" addr add 10.77.98.1/24 dev faa2 && ip -n "$nsb" addr add 10.77.98.2/24 dev fab2 &&
        ip -n "$nsa" link set faa2 up && ip -n "$nsb" link set fab2 up
}
ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
    veth faac fabc 10.77.95 && veth faa0 fab0 10.77.96 && bridged &&
    veth faa1 fab1 10.77.97 && wait_carrier || { echo "failover netns: cannot set up the namespaces"; exit 1; }

check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }
absent() { check [ "$(cat "${@:2}" | grep -c "$1")" = 0 ]; }
show() { sed "s/^/  $1| /" "$out/$1"; }
now() { date +%s.%N; }
want() { case " ${CASES:-1 2 3 4 5 6 7} " in *" $1 "*) return 0;; esac; return 1; }

# txd IF S: the bytes IF in A transmitted over S seconds.
txd() {
    ip netns exec "$nsa" sh -c 'f=/sys/class/net/$1/statistics/tx_bytes; a=$(cat $f);
        sleep $2; echo $(($(cat $f) - a))' sh "$1" "$2"
}
backs() { grep -c "moved back from" "$out/$1.a"; }
# toggle NAME IF D1 D2 ...: IF (down now) in A goes up after D1 s, down after D2, ...
# Before each change it notes the time and A's move-back lines so far in NAME.ev;
# after the last (up) it notes IF's transmitted bytes over 0.5 s (IF runs, the comm
# must still be away: the hold-down), then waits for the move back and notes them
# again over 1 s (the traffic runs there again).
toggle() {
    local name=$1 ifc=$2 state=down d t0 tx
    shift 2
    for d in "$@"; do
        sleep "$d"
        [ $state = down ] && state=up || state=down
        echo "$state $(now) backs $(backs "$name")" >>"$out/$name.ev"
        ip -n "${TOGGLE_NS:-$nsa}" link set "$ifc" $state
    done
    [ -n "${SEQ:-}" ] || return 0
    sleep 0.2; tx=$(txd "$ifc" 0.5)
    echo "held $(now) backs $(backs "$name") tx $tx" >>"$out/$name.ev"
    for _ in $(seq 400); do [ "$(backs "$name")" = 0 ] || break; sleep 0.025; done
    t0=$(now); tx=$(txd "$ifc" 1)
    echo "back $t0 backs $(backs "$name") tx $tx" >>"$out/$name.ev"
}

# strangers NAME: once both processes log their rescue listeners, open an idle
# connection to each of them from the other namespace (bash's /dev/tcp: it
# connects, then sends nothing for 100 s, or until run kills it once both processes
# exited). Notes each address in NAME.strangers.
strangers() {
    local name=$1 side ns addr
    for _ in $(seq 100); do
        grep -q "rescue listeners on" "$out/$name.a" && grep -q "rescue listeners on" "$out/$name.b" &&
            break
        sleep 0.1
    done
    for side in a b; do
        [ $side = a ] && ns=$nsb || ns=$nsa
        for addr in $(sed -n 's/.*failover: rescue listeners on \(.*\); link watch on.*/\1/p' \
            "$out/$name.$side" | head -1 | tr -d ,); do
            ip netns exec "$ns" bash -c "exec 3<>/dev/tcp/${addr%:*}/${addr##*:} && exec sleep 100" &
            stranger_pids="$stranger_pids $!"
            echo "$side $addr" >>"$out/$name.strangers"
        done
    done
    sleep 0.2
}

# run NAME IFS_A IFS_B TOTAL FAULT: A sends TOTAL to B, every byte checked. FAULT:
#   none | down (A's active interface down 1 s into the data, up DOWN_S later) | kill |
#   downb (B's active interface down instead)
run() {
    local name=$1 ifa=$2 ifb=$3 total=$4 fault=$5 t0 active
    ip netns exec "$nsa" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=$ifa" \
        NCCL_DEBUG=INFO ${ENV_AB:-} timeout -k 5 120 "$bench" --server "10.77.95.1:$port" \
        --timeout 30 --total "$total" --msg 4M --verify >"$out/$name.a" 2>&1 &
    spid=$!
    ip netns exec "$nsb" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=$ifb" \
        NCCL_DEBUG=INFO ${ENV_AB:-} timeout -k 5 120 "$bench" --client "10.77.95.1:$port" \
        --timeout 30 --total "$total" --msg 4M --verify >"$out/$name.b" 2>&1 &
    cpid=$!
    port=$((port + 1))
    [ -n "${STRANGERS:-}" ] && strangers "$name"
    if [ "$fault" != none ]; then
        for _ in $(seq 100); do grep -q "^# server (this side" "$out/$name.a" && break; sleep 0.1; done
        active=$(sed -n 's/^# server (this side.*device 0 = \([a-z0-9]*\):.*/\1/p' "$out/$name.a")
        sleep "${FAULT_AFTER:-1}"
        fault_t=$(now)
        if [ "$fault" = kill ]; then
            # rail-bench (the child of timeout), then timeout; /proc, not pgrep: a fresh
            # minbase root (make test-fresh) has no procps
            kill -9 $(cat /proc/"$spid"/task/*/children 2>/dev/null) "$spid"
        elif [ "$fault" = downb ]; then
            active=$(sed -n 's/^# client (this side.*device 0 = \([a-z0-9]*\):.*/\1/p' "$out/$name.b")
            echo "failover netns: $name: $active down in B at $fault_t"
            ip -n "$nsb" link set "$active" down
            TOGGLE_NS=$nsb toggle "$name" "$active" ${DOWN_S:-3} &
        else
            echo "failover netns: $name: $active down in A at $fault_t"
            ip -n "$nsa" link set "$active" down
            toggle "$name" "$active" ${SEQ:-${DOWN_S:-3}} &
        fi
    fi
    wait "$cpid"; crc=$?
    wait "$spid"; src=$?
    spid=
    if [ -n "$stranger_pids" ]; then kill $stranger_pids 2>/dev/null; stranger_pids=; fi
    wait
    wait_carrier
    echo "failover netns: $name: sender exit $src, receiver exit $crc"
}

# FAILOVER_COST=ROUNDS: only measure the no-failure cost, failover on against off
# (rail-bench latency at 8 B, bandwidth at 64 KiB and 64 MiB, both interfaces named).
bench_pair() {
    ip netns exec "$nsa" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=faa0,faa1" "$@" \
        timeout 120 "$bench" --server "10.77.95.1:$port" --timeout 30 >/dev/null 2>&1 &
    local p=$!
    ip netns exec "$nsb" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=fab0,fab1" "$@" \
        timeout 120 "$bench" --client "10.77.95.1:$port" --timeout 30 -b 8 -e 8 -L -n 20000 \
        | awk '/^ +8 /{ printf "lat8B_us %s ", $3 }'
    wait "$p"; port=$((port + 1))
    [ -n "${LAT_ONLY:-}" ] && { echo; return; }
    for sz in 64K 64M; do
        ip netns exec "$nsa" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=faa0,faa1" "$@" \
            timeout 120 "$bench" --server "10.77.95.1:$port" --timeout 30 >/dev/null 2>&1 &
        p=$!
        ip netns exec "$nsb" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=fab0,fab1" "$@" \
            timeout 120 "$bench" --client "10.77.95.1:$port" --timeout 30 -b $sz -e $sz -B \
            | awk -v s=$sz '/^ +[0-9]/{ printf "bw%s_GBs %s ", s, $4 }'
        wait "$p"; port=$((port + 1))
    done
    echo
}
if [ -n "${FAILOVER_COST:-}" ]; then
    for r in $(seq "$FAILOVER_COST"); do
        echo "round $r failover=1: $(bench_pair NCCL_RAIL_FAILOVER=1)"
        echo "round $r failover=0: $(bench_pair NCCL_RAIL_FAILOVER=0)"
    done
    exit 0
fi

# 1. The move: every byte right, both sides name both interfaces.
# move_checks NAME: both exit 0, every byte right, one move line on each side naming both
# interfaces; prints the time from the fault to the first completion on the new path.
move_checks() {
    local n=$1 done_t line
    check [ "$src" = 0 ] && check [ "$crc" = 0 ] || { show "$n.a"; show "$n.b"; }
    check grep -q "^rail-bench: verified: every byte right" "$out/$n.b"
    check grep -q "^rail-bench: verified: every byte right" "$out/$n.a"
    check grep -Eq "WARN .*send comm to peer 10\.77\.96\.2:[0-9]+ moved from faa0 10\.77\.96\.1:[0-9]+ to faa1 10\.77\.97\.1:[0-9]+ \(peer now 10\.77\.97\.2:[0-9]+\): .*ms; re-sent" \
        "$out/$n.a" || grep -a "moved\|WARN" "$out/$n.a"
    check grep -Eq "WARN .*receive comm from peer 10\.77\.96\.1:[0-9]+ moved from fab0 10\.77\.96\.2:[0-9]+ to fab1 10\.77\.97\.2:[0-9]+ " \
        "$out/$n.b" || grep -a "moved\|WARN" "$out/$n.b"
    check [ "$(grep -c "moved from" "$out/$n.a")" = 1 ]
    grep -h "moved from\|first message" "$out/$n.a" "$out/$n.b" | sed 's/^/  /'
    done_t=$(sed -n 's/.*first message completed on the new path .*(at \([0-9.]*\)).*/\1/p' "$out/$n.a" | head -1)
    check [ -n "$done_t" ] &&
        echo "failover netns: $n: fault to first completion on the new path:" \
            "$(awk -v a="$fault_t" -v b="$done_t" 'BEGIN { printf "%.1f", (b - a) * 1000 }') ms"
    line=$(grep "^rail-bench: moved" "$out/$n.b")
    echo "failover netns: $n: ${line#rail-bench: }"
}
if want 1; then
run move "faa0,faa1" "fab0,fab1" 12G down
move_checks move
fi

# 2. NCCL_RAIL_FAILOVER=0: the same fault fails as today (after NCCL_RAIL_PEER_TIMEOUT).
if want 2; then
ENV_AB="NCCL_RAIL_FAILOVER=0 NCCL_RAIL_PEER_TIMEOUT=4" DOWN_S=12 run off "faa0,faa1" "fab0,fab1" 6G down
check [ "$src" != 0 ] && check [ "$crc" != 0 ] || { show off.a; show off.b; }
absent "moved from" "$out/off.a" "$out/off.b"
check grep -q "WARN " "$out/off.a" || show off.a
fi

# 3. One data interface: nothing moves, no rescue listener; the fault fails as today.
if want 3; then
run single faa0 fab0 1G none
check [ "$src" = 0 ] && check [ "$crc" = 0 ] || { show single.a; show single.b; }
absent "rescue listeners\|moved from" "$out/single.a" "$out/single.b"
ENV_AB="NCCL_RAIL_PEER_TIMEOUT=4" DOWN_S=12 run singledown faa0 fab0 6G down
check [ "$src" != 0 ] && check [ "$crc" != 0 ] || { show singledown.a; show singledown.b; }
absent "moved from" "$out/singledown.a" "$out/singledown.b"
fi

# 4. The sender dies: the receiver fails at once, no move.
if want 4; then
t0=$SECONDS
FAULT_AFTER=0.3 run kill "faa0,faa1" "fab0,fab1" 40G kill
check [ "$crc" != 0 ] || show kill.b
absent "moved from" "$out/kill.b"
check [ $((SECONDS - t0)) -lt 20 ]
fi

# 5. Move back (NCCL_RAIL_FAILOVER_HOLDDOWN=2): down 1 s in, up 3 s later; the comm
# (transfers long enough to outlast the last hold-down at 2.6 GB/s, the fresh root's rate:
# with 16 GiB the flap case ended before its move back there)
# moves back once faa0 ran for 2 s, every byte right. FLAP: up for 1 s, down again
# for 1.5 s, up: no move back during the short run, none in the first second of the
# last one (the hold-down starts again), then one.
# back_checks NAME: one move-back line on each side naming the first interfaces,
# traffic on faa0 again after it and (nearly) none while held down.
back_checks() {
    local n=$1 up held back
    check [ "$src" = 0 ] && check [ "$crc" = 0 ] || { show "$n.a"; show "$n.b"; }
    check grep -q "^rail-bench: verified: every byte right" "$out/$n.b"
    check grep -Eq "^NET/Rail : send comm to peer 10\.77\.97\.2:[0-9]+ moved back from faa1 10\.77\.97\.1:[0-9]+ to faa0 10\.77\.96\.1:[0-9]+ \(peer now 10\.77\.96\.2:[0-9]+\): faa0 up for [0-9]+ s; .*ms; re-sent" \
        "$out/$n.a" || grep -a "moved\|WARN" "$out/$n.a"
    check grep -Eq "^NET/Rail : receive comm from peer 10\.77\.97\.1:[0-9]+ moved back from fab1 10\.77\.97\.2:[0-9]+ to fab0 10\.77\.96\.2:[0-9]+ .*: the sender moved back" \
        "$out/$n.b" || grep -a "moved\|WARN" "$out/$n.b"
    check [ "$(grep -c "moved back from" "$out/$n.a")" = 1 ]
    check [ "$(grep -c "moved back from" "$out/$n.b")" = 1 ]
    grep -h "moved back from" "$out/$n.a" "$out/$n.b" | sed 's/^/  /'
    sed 's/^/  ev| /' "$out/$n.ev"
    up=$(awk '$1 == "up" { t = $2 } END { print t }' "$out/$n.ev")
    held=$(awk '$1 == "held" { print $6 }' "$out/$n.ev")
    back=$(awk '$1 == "back" { print $2, $4, $6 }' "$out/$n.ev")
    check [ -n "$held" ] && check [ "$held" -lt 1000000 ]      # faa0 runs, the comm is held away
    check [ "$(awk '$1 == "held" { print $4 }' "$out/$n.ev")" = 0 ]
    set -- $back
    check [ "${2:-0}" = 1 ] && check [ "${3:-0}" -gt 100000000 ]  # > 100 MB on faa0 in 1 s after it
    echo "failover netns: $n: faa0 up to the move back seen: $(awk -v a="$up" -v b="${1:-0}" \
        'BEGIN { printf "%.2f", b - a }') s (hold-down 2 s); faa0 sent $((${3:-0} >> 20)) MiB in the next second"
}
if want 5; then
ENV_AB="NCCL_RAIL_FAILOVER_HOLDDOWN=2" SEQ=3 run back "faa0,faa1" "fab0,fab1" 32G down
back_checks back
ENV_AB="NCCL_RAIL_FAILOVER_HOLDDOWN=2" SEQ="2 1 1.5" run flap "faa0,faa1" "fab0,fab1" 48G down
back_checks flap
# No move back while faa0 ran for 1 s: still none when it went down again.
check [ "$(awk '$1 == "down" { print $4 }' "$out/flap.ev")" = 0 ]
fi

# 6. Please move: B's interface fails, A's keeps running (the bridge): B's receive comm asks
# A to move (a KICK on A's rescue listener on faa1), A moves; every byte right.
if want 6; then
run please "faa2,faa1" "fab2,fab1" 12G downb
check [ "$src" = 0 ] && check [ "$crc" = 0 ] || { show please.a; show please.b; }
check grep -q "^rail-bench: verified: every byte right" "$out/please.b"
check grep -Eq "^NET/Rail : receive comm from peer 10\.77\.98\.1:[0-9]+: fab2 stopped running \(link watch\); asked the sender to move \(10\.77\.97\.1:[0-9]+\)" \
    "$out/please.b" || grep -a "moved\|asked\|WARN" "$out/please.b"
check grep -Eq "WARN .*send comm to peer 10\.77\.98\.2:[0-9]+ moved from faa2 10\.77\.98\.1:[0-9]+ to faa1 10\.77\.97\.1:[0-9]+ \(peer now 10\.77\.97\.2:[0-9]+\): the receiver asked \(its path failed\)" \
    "$out/please.a" || grep -a "moved\|WARN" "$out/please.a"
check grep -Eq "WARN .*receive comm from peer 10\.77\.98\.1:[0-9]+ moved from fab2 10\.77\.98\.2:[0-9]+ to fab1 10\.77\.97\.2:[0-9]+ " \
    "$out/please.b" || grep -a "moved\|WARN" "$out/please.b"
absent "link watch: faa2" "$out/please.a"       # A saw nothing: the KICK moved it
check [ "$(grep -c "moved from" "$out/please.a")" = 1 ]
grep -h "moved from\|asked the sender\|first message" "$out/please.a" "$out/please.b" | sed 's/^/  /'
done_t=$(sed -n 's/.*first message completed on the new path .*(at \([0-9.]*\)).*/\1/p' "$out/please.a" | head -1)
check [ -n "$done_t" ] &&
    echo "failover netns: please: fault in B to A's first completion on the new path:" \
        "$(awk -v a="$fault_t" -v b="$done_t" 'BEGIN { printf "%.1f", (b - a) * 1000 }') ms"
fi

# 7. The move of case 1 with a stranger idle on every rescue port of both processes
# (the rescue thread must not wait on one peer): the same checks; each stranger is
# dropped (INFO naming its address), no WARN about them; both processes exit.
if want 7; then
t0=$(now)
STRANGERS=1 run strangers "faa0,faa1" "fab0,fab1" 12G down
t1=$(now)
move_checks strangers
# The transfer takes 10-30 s: both processes exit well before the strangers give up after
# 100 s (finalize stops the rescue thread, which must not wait on them).
check awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 75) }'
check [ "$(wc -l <"$out/strangers.strangers")" = 4 ]
for side in a b; do
    check grep -Eq "^NET/Rail : .*rescue listener.* from 10\.77\.9[67]\.[12]:[0-9]+" "$out/strangers.$side" ||
        grep -a "rescue listener" "$out/strangers.$side"
    absent "WARN .*rescue listener" "$out/strangers.$side"
done
echo "failover netns: strangers: both processes exited $(awk -v a="$t0" -v b="$t1" \
    'BEGIN { printf "%.1f", b - a }') s after the start"
fi

if [ "$fails" -ne 0 ]; then
    echo "failover netns: $fails check(s) FAILED"
    exit 1
fi
echo "failover netns: all checks passed"
