#!/usr/bin/env bash
# make test-rxe2: the plugin between two QEMU/TCG guests (test/rxe2/run.sh),
# one Soft-RoCE node each, over the verbs transport:
#   conformance  the conformance suite, role A in guest A, role B in guest B
#   kill-b       the sender's guest is killed mid-transfer: the receiver must fail
#   kill-a       the receiver's guest is killed mid-transfer: the sender must fail
#   link-b       the sender's NIC loses its link mid-transfer (QEMU set_link off)
#   kill-b-r6, kill-a-r6  kill-b and kill-a with NCCL_IB_RETRY_CNT=6 and
#                NCCL_IB_TIMEOUT=14 (67 ms): the verbs layer's own bound, where
#                rxe has one (retry_cnt 7 is "forever" on rxe)
# Opt-in, not in the default list (make test-rxe2-failover; each guest gets
# three NICs, run.sh --nics 3: the out-of-band traffic on the first, rxe0 and
# rxe1 on the other two, all four rxe NICs on one segment):
#   fo-link-b    verbs failover: B's (the sender's) rxe0 NIC loses its link
#                for RXE2_FO_DOWN s mid-loop: B moves rxe0 -> rxe1, A rebuilds
#                on its rxe0, and both move back after the hold-down
#   fo-link-a    the same with A's (the receiver's) rxe0 NIC
#   fo-rails-b   fo-link-b with each pair of same-index NICs on its own network
#                (two rails, run.sh --rxe-net rails: 192.0.3.0/24 and
#                192.0.4.0/24): B moves rxe0 -> rxe1, and A, whose rxe0 cannot
#                reach B's rxe1, follows it to its rail (rxe0 -> rxe1, "follows
#                the peer to 192.0.4.0/24"); both move back after the hold-down
# Each failover case passes only if both roles PASS failover-loop (every byte
# checked, no failed request) and the move lines appear; it prints the time to
# recover, from the fault to the end of the slowest round, on the host's clock.
# Each fault case prints how long after the fault the surviving side's plugin
# reported an error, or that it did not within RXE2_FAULT_TIMEOUT seconds.
# The fault cases run with NCCL_RAIL_PEER_TIMEOUT=RXE2_PEER_TIMEOUT (10 s):
# the plugin's watchdog (keepalive on each verbs connection's handshake
# socket) must fail the survivor within about that bound, whatever the verbs
# layer does (rxe treats NCCL_IB_RETRY_CNT=7 as retry forever). A hang fails
# the case; RXE2_STRICT=0 turns hangs into KNOWN GAP lines (for a plugin
# built without the watchdog).
#
#   test/rxe2/tests.sh [CASE...]      default: all six
# Environment: RXE2_FAULT_TIMEOUT (default 60), RXE2_PEER_TIMEOUT (default
# 10), RXE2_STRICT (default 1), RXE2_FO_SECONDS (the failover loop, default
# 20), RXE2_FO_DOWN (link down, default 3), RXE2_FO_HOLDDOWN (default 3),
# RXE2_SCENARIOS
# (the conformance cases, default all), RXE2_MAX_SIZE (default 16M), and
# everything test/rxe2/run.sh reads. Figures: build/rxe2-runs/summary.txt.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd -P)
cd "$REPO" || exit 2
conf=build/rail-conformance
plugin=build/libnccl-net-rail.so
[ -x "$conf" ] && [ -f "$plugin" ] || { echo "$conf or $plugin missing: run make all tests"; exit 2; }

FT=${RXE2_FAULT_TIMEOUT:-60}
STRICT=${RXE2_STRICT:-1}
PT=${RXE2_PEER_TIMEOUT:-10}
MAXSZ=${RXE2_MAX_SIZE:-16M}
FO_SECONDS=${RXE2_FO_SECONDS:-20}
FO_DOWN=${RXE2_FO_DOWN:-3}
FO_HOLD=${RXE2_FO_HOLDDOWN:-3}
CASES=${*:-conformance kill-b kill-a link-b kill-b-r6 kill-a-r6}
SUMMARY=$REPO/build/rxe2-runs/summary.txt
mkdir -p "$(dirname "$SUMMARY")"
: >"$SUMMARY"
fails=0 gaps=0
C="$conf --plugin $plugin --abi 12"
export NCCL_RAIL_TRANSPORT=ib

record() { echo "$*" | tee -a "$SUMMARY"; }

# Every scenario but peer-dies (the fault cases run it).
default_scenarios() {
    "$conf" --list | awk '{print $1}' | grep -Evx 'peer-dies' | paste -sd, -
}

case_conformance() {
    local list=${RXE2_SCENARIOS:-$(default_scenarios)} t0=$SECONDS rc=0 out sc
    sc="--scenario $list"
    out=$REPO/build/rxe2-runs/conformance
    test/rxe2/run.sh --out "$out" --timeout 1500 \
        --cmd-a "$C --max-size $MAXSZ $sc --ctl-listen 192.0.2.1:18700" \
        --cmd-b "$C --max-size $MAXSZ $sc --ctl-connect 192.0.2.1:18700" || rc=$?
    record "conformance: exit $rc in $((SECONDS - t0)) s; A: $(tail -n1 "$out/A/out/cmd.log" 2>/dev/null)," \
        "B: $(tail -n1 "$out/B/out/cmd.log" 2>/dev/null)"
    grep -h '^FAIL' "$out"/A/out/cmd.log "$out"/B/out/cmd.log 2>/dev/null | sed 's/^/  /' | tee -a "$SUMMARY"
    [ "$rc" = 0 ] || fails=$((fails + 1))
}

# fault case: NAME FAULT DOOMED SURVIVOR WHAT [run.sh options]
case_fault() {
    local name=$1 fault=$2 doomed=$3 surv=$4 what=$5 t0=$SECONDS rc=0 out line cmd
    shift 5
    out=$REPO/build/rxe2-runs/$name
    cmd="$C --scenario peer-dies --max-size 4M --doomed $doomed --timeout $FT"
    cmd+=" --event-file \$RXE_OUT/events"
    test/rxe2/run.sh --out "$out" --timeout $((FT + 120)) --fault "$fault" \
        --env NCCL_RAIL_PEER_TIMEOUT="$PT" "$@" \
        --cmd-a "$cmd --ctl-listen 192.0.2.1:18700" \
        --cmd-b "$cmd --ctl-connect 192.0.2.1:18700" || rc=$?
    line=$(grep -E "^$surv \+[0-9.]+ $surv [0-9.]+ (ERROR|HANG)" "$out/fault.txt" 2>/dev/null | head -n1)
    # "<guest> +<s after the fault> <role> <role's s> ERROR|HANG <text>"
    local dt=${line#"$surv +"} text=${line#* * * * }
    dt=${dt%% *}
    if [[ $line == *" ERROR "* ]]; then
        record "$name ($what): $surv's plugin reported an error ${dt} s after the fault:" \
            "$text [run $((SECONDS - t0)) s]"
    elif [[ $line == *" HANG "* ]]; then
        record "$name ($what): KNOWN GAP: $surv saw no error in ${dt} s after the fault" \
            "($text) [run $((SECONDS - t0)) s]. The watchdog (NCCL_RAIL_PEER_TIMEOUT=$PT)" \
            "did not fire: rxe retries NCCL_IB_RETRY_CNT=7 forever, and a side with nothing" \
            "in flight (a sender waiting for a clear-to-send, a receiver waiting for data) never" \
            "gets a completion at all"
        gaps=$((gaps + 1))
        [ "$STRICT" = 1 ] && fails=$((fails + 1))
    else
        record "$name ($what): FAIL: no ERROR/HANG line from $surv (run exit $rc; see $out)"
        fails=$((fails + 1))
    fi
    grep -v "^$surv +[0-9.]* $surv " "$out/fault.txt" 2>/dev/null | grep -v '^fault ' |
        sed 's/^/  also: /' | tee -a "$SUMMARY"
    # The survivor must also finish: its verdict PASS (closing its failed comm
    # once waited ~50 s for a QP that still retried, and the role timed out).
    if [[ $line == *" ERROR "* ]] && ! grep -q '^PASS peer-dies' "$out/$surv/out/cmd.log" 2>/dev/null; then
        record "$name: FAIL: $surv reported the error but did not finish cleanly:" \
            "$(grep -E '^(FAIL|SKIP) ' "$out/$surv/out/cmd.log" 2>/dev/null | head -n1)"
        fails=$((fails + 1))
    fi
}

# failover case: NAME SIDE (a or b: whose rxe0 NIC is pulled) [run.sh options]
case_failover() {
    local name=$1 side=$2 f=${2^^} o t0=$SECONDS rc=0 out cmd ok=1 log_f log_o fk ok_k g
    shift 2
    o=$([ "$f" = A ] && echo B || echo A)
    fk=$([ "$f" = A ] && echo receive || echo send)
    ok_k=$([ "$f" = A ] && echo send || echo receive)
    out=$REPO/build/rxe2-runs/$name
    cmd="NCCL_SOCKET_IFNAME==\$RXE2_OOB_IF NCCL_IB_HCA==rxe0,rxe1 $C --scenario failover-loop"
    cmd+=" --timeout $((FO_SECONDS + 120)) -v"
    test/rxe2/run.sh --out "$out" --nics 3 --timeout $((FO_SECONDS + 240)) \
        --fault "link-$side:1" --fault-after 2 --fault-down "$FO_DOWN" --watch ' moved( back)? from ' \
        --env RAIL_CONF_FAILOVER_SECONDS="$FO_SECONDS" --env NCCL_RAIL_FAILOVER_HOLDDOWN="$FO_HOLD" \
        --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=NET --env NCCL_RAIL_PEER_TIMEOUT="$PT" "$@" \
        --cmd-a "$cmd --ctl-listen 192.0.2.1:18700 --event-file \$RXE_OUT/events" \
        --cmd-b "$cmd --ctl-connect 192.0.2.1:18700" || rc=$?
    log_f=$out/$f/out/cmd.log log_o=$out/$o/out/cmd.log
    grep -h '^PASS\|^FAIL\|^SKIP\|slowest' "$out"/A/out/cmd.log "$out"/B/out/cmd.log 2>/dev/null |
        sed "s/^/  /" | tee -a "$SUMMARY"
    grep -h 'moved\|no other usable\|went down\|ACTIVE again\|completion error\|WARN' \
        "$out"/A/out/cmd.log "$out"/B/out/cmd.log 2>/dev/null | cut -c1-400 | sed "s/^/  log: /" | tee -a "$SUMMARY"
    fo_want "$name" "$log_f" "($fk comm) moved from rxe0:1 to rxe1:1" || ok=0
    fo_want "$name" "$log_f" "($fk comm) moved back from rxe1:1 to rxe0:1" || ok=0
    if [[ $name == *rails* ]]; then # the joining side follows to rail 2 and back
        fo_want "$name" "$log_o" "($ok_k comm) moved from rxe0:1 to rxe1:1" || ok=0
        fo_want "$name" "$log_o" "follows the peer to 192.0.4.0/24" || ok=0
        fo_want "$name" "$log_o" "($ok_k comm) moved back from rxe1:1 to rxe0:1" || ok=0
    else
        fo_want "$name" "$log_o" "($ok_k comm) moved from rxe0:1 to rxe0:1" || ok=0
    fi
    for g in A B; do
        grep -q '^PASS failover-loop' "$out/$g/out/cmd.log" 2>/dev/null ||
            { record "$name: FAIL: role $g did not PASS failover-loop"; ok=0; }
    done
    [ "$rc" = 0 ] || { record "$name: FAIL: run exit $rc"; ok=0; }
    fo_times "$name" "$out" "$f"
    record "$name: $(fo_recovery "$out") [run $((SECONDS - t0)) s]"
    if [ "$ok" = 1 ]; then
        record "$name: PASS (link of $f's rxe0 NIC down ${FO_DOWN} s, hold-down ${FO_HOLD} s)"
    else
        record "$name: FAIL (see $out)"
        fails=$((fails + 1))
    fi
}
fo_want() { # NAME LOG TEXT
    grep -qF -- "$3" "$2" 2>/dev/null && return 0
    record "$1: FAIL: no \"$3\" in ${2#"$REPO"/}"
    return 1
}
# The time to recover, on the host's clock: the fault to the move's log line
# on the side whose link was pulled (run.sh --watch: the host saw the line
# in the guest's output within 50 ms of its write, over 9p), and the
# move-back's line from the link coming up (hold-down included).
fo_times() { # NAME OUT SIDE
    local mv back up fault
    mv=$(sed -n "s/^$3 +\([0-9.]*\) log: .* moved from .*/\1/p" "$2/fault.txt" 2>/dev/null | head -n1)
    back=$(sed -n "s/^$3 +\([0-9.]*\) log: .* moved back from .*/\1/p" "$2/fault.txt" 2>/dev/null | head -n1)
    fault=$(sed -n 's/^fault .* at \([0-9.]*\)$/\1/p' "$2/fault.txt" 2>/dev/null)
    up=$(sed -n 's/^link-up .* at \([0-9.]*\)$/\1/p' "$2/fault.txt" 2>/dev/null)
    awk -v n="$1" -v m="$mv" -v b="$back" -v f="$fault" -v u="$up" -v h="$FO_HOLD" 'BEGIN {
        printf "%s: time to recover (link down to the move line): %s s; ", n, m == "" ? "unknown" : m
        if (b == "" || u == "") print "move back: unknown"
        else printf "moved back %.2f s after the link came up (hold-down %s s)\n", b - (u - f), h }' |
        tee -a "$SUMMARY"
}
# The slowest round, on the host's clock: the fault (run.sh's fault.txt, host
# epoch) to the end of the slowest round (A's DONE line, A's epoch, plus the
# host-minus-A clock offset of clock.txt). The move's round, or the move-back's.
fo_recovery() {
    local out=$1 fault end off ms
    fault=$(sed -n 's/^fault .* at \([0-9.]*\)$/\1/p' "$out/fault.txt" 2>/dev/null)
    end=$(sed -n 's/.* DONE .*longest_end=\([0-9.]*\).*/\1/p' "$out/A/out/events" 2>/dev/null)
    ms=$(sed -n 's/.* DONE .*longest_ms=\([0-9.]*\).*/\1/p' "$out/A/out/events" 2>/dev/null)
    off=$(awk '$1 == "A" { print $2 }' "$out/clock.txt" 2>/dev/null)
    awk -v a="$fault" -v b="$end" -v o="$off" -v ms="$ms" 'BEGIN {
        if (a == "" || b == "" || o == "") { print "time to recover: unknown"; exit }
        printf "the slowest round (%.0f ms) ended %.2f s after the fault (host clock; A%+.3f s)\n",
            ms, b + o - a, o }'
}

T0=$SECONDS
for c in $CASES; do
    echo "==== rxe2 case $c"
    case $c in
    conformance) case_conformance ;;
    kill-b) case_fault kill-b kill-b B A "the sender's guest killed" ;;
    kill-a) case_fault kill-a kill-a A B "the receiver's guest killed" ;;
    link-b) case_fault link-b link-b B A "the sender's NIC link down" ;;
    link-a) case_fault link-a link-a A B "the receiver's NIC link down" ;;
    fo-link-b) case_failover fo-link-b b ;;
    fo-link-a) case_failover fo-link-a a ;;
    fo-rails-b) case_failover fo-rails-b b --rxe-net rails ;;
    kill-b-r6 | kill-a-r6)
        local_f=${c%-r6}
        case_fault "$c" "$local_f" "$([ "$local_f" = kill-b ] && echo B || echo A)" \
            "$([ "$local_f" = kill-b ] && echo A || echo B)" \
            "$([ "$local_f" = kill-b ] && echo "the sender's" || echo "the receiver's") guest killed, retry_cnt 6, timeout 14" \
            --env NCCL_IB_RETRY_CNT=6 --env NCCL_IB_TIMEOUT=14
        ;;
    *) echo "unknown case $c"; fails=$((fails + 1)) ;;
    esac
done
record "rxe2: $fails failed, $gaps known gaps, $((SECONDS - T0)) s (strict=$STRICT)"
exit $((fails > 0))
