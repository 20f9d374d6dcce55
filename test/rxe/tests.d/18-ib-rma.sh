#!/bin/bash
# The verbs RMA backend (NCCL_RAIL_RMA_IB=1, src/rma/rma_ib*.c) on real verbs,
# host memory: test_rma_ib with RMA_IB_LIVE=1 (ranks as threads, rank r on
# device r % ndev: rxe0, rxe1, rxe0, ...): puts, INC/ADD signals, puts to
# itself, gets and flush over 2 and 4 ranks, a signal alone, 32 puts then a
# signal checked in order, named errors (a put past the window, a misaligned
# signal word, a put into a deregistered window: REM_ACCESS_ERR), and one
# seed of the random mix (3 ranks, 2 contexts, every byte and signal checked;
# RMA_IB_SEED=N, forwarded with --env, replays one). The fake's atomic=no
# test skips live. Kept short for the guest: one mix seed, 200 operations a
# rank.
# rxe-timeout: 180
set -uo pipefail

t=build/test/unit/test_rma_ib
[ -x "$t" ] || { echo "$t missing: run make tests"; exit 1; }
[ -f build/libnccl-net-rail.so ] || { echo "build/libnccl-net-rail.so missing: run make all"; exit 1; }
echo "== RMA_IB_LIVE=1 $t"
start=$(date +%s)
RMA_IB_LIVE=1 RAIL_TEST_REQUIRE_RDMA=1 "$t"
rc=$?
echo "test_rma_ib live: rc $rc, $(($(date +%s) - start)) s"
exit $rc
