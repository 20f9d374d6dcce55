#!/bin/bash
# The conformance suite over real verbs (rxe0 -> rxe1) under ThreadSanitizer:
# the plugin's async-event thread, NCCL's proxy threads (the suite's
# regmr-thread and close-inflight scenarios) and rdma-core's own code in one
# process, which the fake provider of make test-tsan cannot show. Uses the
# build make test-tsan leaves in build-tsan/ (make test runs it before
# test-rxe); without it, a SKIP that says so. v12 only and up to 4M: TSan in
# the TCG guest is slow (about 10x), and the other ABIs share every line of
# transport code with v12.
# rxe-timeout: 900
set -uo pipefail

conf=build-tsan/rail-conformance
plugin=build-tsan/libnccl-net-rail.so
if [ ! -x "$conf" ] || [ ! -f "$plugin" ]; then
    echo "SKIP: $conf or $plugin missing (build them with make test-tsan, which make test runs first)"
    exit 77
fi
export NCCL_RAIL_TRANSPORT=ib
export TSAN_OPTIONS="suppressions=$PWD/test/tsan.supp second_deadlock_stack=1 exitcode=66"
log=$RXE_TEST_OUT/tsan.log
# An injected race must be reported: ThreadSanitizer is active in the guest.
if "$conf" --plugin "$plugin" --abi 12 --scenario properties --inject data-race >"$log.inject" 2>&1 ||
    ! grep -q 'ThreadSanitizer: data race' "$log.inject"; then
    cat "$log.inject"
    echo "FAILED: the injected data race was not reported: ThreadSanitizer is not active"
    exit 1
fi
echo "the injected data race was reported (ThreadSanitizer is active)"
scen=properties,sizes,inflight-32,grouped-recv,recv-larger,send-larger,bidirectional,close-inflight,regmr-thread,iflush,misuse-closed
rc=0
timeout 800 "$conf" --plugin "$plugin" --dev 0 --peer-dev 1 --abi 12 --max-size 4M \
    --scenario "$scen" >"$log" 2>&1 || rc=$?
grep -E '^(PASS|FAIL|SKIP)' "$log"
if grep -q 'ThreadSanitizer' "$log"; then
    grep -A30 'WARNING: ThreadSanitizer' "$log" | head -80
    echo "FAILED: ThreadSanitizer reports (full log: $log)"
    exit 1
fi
[ "$rc" = 0 ] || { tail -20 "$log"; echo "FAILED: rail-conformance exit $rc"; exit 1; }
echo "TSan over verbs: clean"
