/*
 * nccl-net-rail unit tests: the layout of our RMA ABI v14 and v13
 * declarations (include/rma_v14.h, include/rma_v13.h) against NCCL 2.30.7's,
 * on LP64 Linux.
 *
 * The figures were read by compiling a small program against NCCL's own
 * rma_v14.h and rma_v13.h (tag v2.30.7-1, src/include/plugin/rma/; v13 is
 * plugin/gin/gin_v13.h's ncclGin_v13_t) outside this tree; NCCL's headers
 * are not part of the project. A field moved, added or
 * retyped in ours fails the build here (static assertions), and the run
 * checks the constants NCCL passes as values.
 */
#include "unit.h"

#include <stddef.h>

#include "rma_v13.h"
#include "rma_v14.h"

#define OFF(T, m, v) _Static_assert(offsetof(T, m) == (v), #T "." #m " is at " #v " in NCCL 2.30.7")

_Static_assert(sizeof(void *) == 8, "the figures below are LP64's");

_Static_assert(sizeof(ncclRmaConfig_v14_t) == 12, "ncclRmaConfig_v14_t is 12 bytes in NCCL 2.30.7");
OFF(ncclRmaConfig_v14_t, nContexts, 0);
OFF(ncclRmaConfig_v14_t, trafficClass, 4);
OFF(ncclRmaConfig_v14_t, rankStride, 8);

_Static_assert(sizeof(ncclRma_v14_t) == 168, "ncclRma_v14_t is a name and 20 calls");
OFF(ncclRma_v14_t, name, 0);
OFF(ncclRma_v14_t, init, 8);
OFF(ncclRma_v14_t, devices, 16);
OFF(ncclRma_v14_t, getProperties, 24);
OFF(ncclRma_v14_t, listen, 32);
OFF(ncclRma_v14_t, connect, 40);
OFF(ncclRma_v14_t, createContext, 48);
OFF(ncclRma_v14_t, regMrSym, 56);
OFF(ncclRma_v14_t, regMrSymDmaBuf, 64);
OFF(ncclRma_v14_t, deregMrSym, 72);
OFF(ncclRma_v14_t, destroyContext, 80);
OFF(ncclRma_v14_t, closeColl, 88);
OFF(ncclRma_v14_t, closeListen, 96);
OFF(ncclRma_v14_t, iput, 104);
OFF(ncclRma_v14_t, iputSignal, 112);
OFF(ncclRma_v14_t, iget, 120);
OFF(ncclRma_v14_t, iflush, 128);
OFF(ncclRma_v14_t, test, 136);
OFF(ncclRma_v14_t, rmaProgress, 144);
OFF(ncclRma_v14_t, queryLastError, 152);
OFF(ncclRma_v14_t, finalize, 160);

/* v13: the GIN v13 config and table (21 slots, as v14, other signatures). */
_Static_assert(sizeof(ncclGinConfig_v13_t) == 20, "ncclGinConfig_v13_t is 20 bytes in NCCL 2.30.7");
OFF(ncclGinConfig_v13_t, nSignals, 0);
OFF(ncclGinConfig_v13_t, nCounters, 4);
OFF(ncclGinConfig_v13_t, nContexts, 8);
OFF(ncclGinConfig_v13_t, queueDepth, 12);
OFF(ncclGinConfig_v13_t, trafficClass, 16);

_Static_assert(sizeof(ncclRma_v13_t) == 168, "ncclRma_v13_t is a name and 20 calls");
OFF(ncclRma_v13_t, name, 0);
OFF(ncclRma_v13_t, init, 8);
OFF(ncclRma_v13_t, getProperties, 24);
OFF(ncclRma_v13_t, connect, 40);
OFF(ncclRma_v13_t, createContext, 48);
OFF(ncclRma_v13_t, regMrSym, 56);
OFF(ncclRma_v13_t, regMrSymDmaBuf, 64);
OFF(ncclRma_v13_t, deregMrSym, 72);
OFF(ncclRma_v13_t, iput, 104);
OFF(ncclRma_v13_t, iputSignal, 112);
OFF(ncclRma_v13_t, iget, 120);
OFF(ncclRma_v13_t, test, 136);
OFF(ncclRma_v13_t, ginProgress, 144);
OFF(ncclRma_v13_t, queryLastError, 152);
OFF(ncclRma_v13_t, finalize, 160);

/* getProperties fills the net ABI v12 struct. */
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "ncclNetProperties_v12_t is 128 bytes");
OFF(ncclNetProperties_v12_t, maxRecvs, 52);
OFF(ncclNetProperties_v12_t, netDeviceType, 56);
OFF(ncclNetProperties_v12_t, railId, 124);
OFF(ncclNetProperties_v12_t, planeId, 126);

/* The signatures, as NCCL calls them (a mismatch is an incompatible-pointer error). */
static ncclResult_t put_signal(void *c, int ctx, uint64_t so, void *sm, size_t n, uint64_t dof,
			       void *dm, uint32_t rank, uint64_t sigo, void *sigm, uint64_t v,
			       uint32_t op, bool strong, void **req)
{
	(void)c, (void)ctx, (void)so, (void)sm, (void)n, (void)dof, (void)dm, (void)rank;
	(void)sigo, (void)sigm, (void)v, (void)op, (void)strong, (void)req;
	return ncclSuccess;
}

static void test_constants(void **state)
{
	ncclRma_v14_t t = { .iputSignal = put_signal };

	(void)state;
	assert_int_equal(NCCL_NET_MR_FLAG_FORCE_SO, 1);
	assert_int_equal(NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, 2);
	assert_int_equal(NCCL_NET_SIGNAL_OP_INC, 1);
	assert_int_equal(NCCL_NET_SIGNAL_OP_ADD, 2);
	assert_int_equal(NCCL_NET_DEVICE_GIN_PROXY, 2);
	assert_int_equal(NCCL_NET_DEVICE_GIN_GDAKI, 3);
	assert_int_equal(NCCL_NET_DEVICE_GIN_GPI, 4);
	assert_int_equal(sizeof(bool), 1);
	assert_non_null(t.iputSignal);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_constants),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
