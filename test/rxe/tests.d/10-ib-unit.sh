#!/bin/bash
# Verbs transport unit tests on real verbs (rxe0 <-> rxe1): data transfer,
# grouped receives, the flush QP, a wrong nonce, and injected failures of
# ibv_reg_mr / ibv_create_qp / ibv_modify_qp / ibv_post_send (named errors,
# no verbs object left: test/unit/test_ib_live.c), the eager tests again with
# each protocol of the eager ring forced (NCCL_RAIL_IB_EAGER_ORDER=safe, then
# inorder). Then the same binary built
# with AddressSanitizer + LeakSanitizer when build-san/ has it
# (make BUILD=build-san SAN=address,undefined OPT=-O1 build-san/test/unit/test_ib_live).
# rxe-timeout: 400
set -uo pipefail

fails=0
run() {
    echo "== $*"
    if ! "$@"; then
        echo "FAILED: $*"
        fails=$((fails + 1))
    fi
}

export RAIL_TEST_REQUIRE_RDMA=1
for t in test_ib_wire test_ib_gid test_ib_live; do
    [ -x "build/test/unit/$t" ] || { echo "build/test/unit/$t missing: run make all"; exit 1; }
done
run build/test/unit/test_ib_wire
run build/test/unit/test_ib_gid
run build/test/unit/test_ib_live

if [ -x build-san/test/unit/test_ib_live ]; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
        run build-san/test/unit/test_ib_live
else
    echo "note: build-san/test/unit/test_ib_live not built; sanitizer run skipped"
fi
exit $((fails > 0))
