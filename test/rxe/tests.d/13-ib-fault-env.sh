#!/bin/bash
# Fault injection through the environment (NCCL_RAIL_IB_FAULT), the way an
# operator or CI would use it with any program loading the plugin: the
# conformance suite's basic traffic must then fail with a WARN that names the
# verbs call, the errno text, the device:port and the peer, and must not hang.
# Each role is its own process with its own call counts: a connection makes
# 3 ibv_reg_mr (2 control regions, then the first buffer), 1 ibv_create_qp
# and 3 ibv_modify_qp (INIT, RTR, RTS) per role. A failed ibv_modify_qp of a
# connection is tried again only after ETIMEDOUT (NCCL_IB_MQP_RETRY_ALL=0),
# each retry a call of its own: EINVAL fails at once; ETIMEDOUT from the RTR
# on fails after 1 + NCCL_IB_MQP_RETRY_CNT attempts.
# rxe-timeout: 300
set -uo pipefail

conf=build/rail-conformance
plugin=build/libnccl-net-rail.so
export NCCL_RAIL_TRANSPORT=ib
fails=0

expect_named() {
    local fault=$1 call=$2 errtext=$3 out
    out=$(NCCL_RAIL_IB_FAULT=$fault timeout 120 "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 \
        --abi 12 --scenario sizes --max-size 1M --timeout 60 2>&1)
    printf '%s\n' "$out" >"$RXE_TEST_OUT/${fault//[:+]/_}.log"
    if ! printf '%s\n' "$out" | grep "WARN" | grep -F "$call" | grep -F "$errtext" | grep "peer" |
        grep -qE "rxe[01]:1"; then
        echo "FAILED: NCCL_RAIL_IB_FAULT=$fault: no WARN naming $call, '$errtext', the device:port and the peer"
        printf '%s\n' "$out" | grep WARN | head -5
        fails=$((fails + 1))
        return
    fi
    printf '%s\n' "$out" | grep "WARN" | grep -F "$call" | head -1
}

expect_named "ibv_reg_mr:ENOMEM:3" "ibv_reg_mr" "Cannot allocate memory"
expect_named "ibv_create_qp:ENOSPC:1" "ibv_create_qp" "No space left on device"
expect_named "ibv_modify_qp:EINVAL:2" "ibv_modify_qp(RTR)" "Invalid argument"
export NCCL_IB_MQP_RETRY_CNT=2 NCCL_IB_MQP_RETRY_SLEEP_MSEC=10
expect_named "ibv_modify_qp:ETIMEDOUT:2+" "ibv_modify_qp(RTR)" \
    "(1 + NCCL_IB_MQP_RETRY_CNT=2): Connection timed out"
unset NCCL_IB_MQP_RETRY_CNT NCCL_IB_MQP_RETRY_SLEEP_MSEC
expect_named "ibv_post_send:EIO:2" "ibv_post_send" "Input/output error"
exit $((fails > 0))
