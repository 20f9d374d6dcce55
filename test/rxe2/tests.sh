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
# 10), RXE2_STRICT (default 1), RXE2_SCENARIOS
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

T0=$SECONDS
for c in $CASES; do
    echo "==== rxe2 case $c"
    case $c in
    conformance) case_conformance ;;
    kill-b) case_fault kill-b kill-b B A "the sender's guest killed" ;;
    kill-a) case_fault kill-a kill-a A B "the receiver's guest killed" ;;
    link-b) case_fault link-b link-b B A "the sender's NIC link down" ;;
    link-a) case_fault link-a link-a A B "the receiver's NIC link down" ;;
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
