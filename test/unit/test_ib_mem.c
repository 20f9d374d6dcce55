/*
 * nccl-net-rail unit tests on the fake verbs provider: memory per verbs
 * connection (issue 26).
 *
 * N connections (a send comm and its receive comm, both in this process:
 * one peer's worth) are opened on one fake device; the fake counts what
 * the process holds (fv_test_mem): the bytes registered (ibv_reg_mr
 * lengths), the pages they pin, and the QP and CQ buffers as mlx5 would
 * size them for the depths asked. Per connection, Rail must hold no more
 * than NCCL's own IB transport (NCCL 2.30.7, one QP per connection)
 * registers and pins for the same pair: the figures below, derived term by
 * term in docs/PERFORMANCE.md ("Memory per connection").
 *
 * RAIL_MEM_PAIRS=N (default 16) sets N; the per-connection figures and the
 * growth of the resident set are printed, for the table of
 * docs/PERFORMANCE.md (N=1024 needs `ulimit -n 4096`).
 */
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>

#include "fv_harness.h"

/*
 * NCCL 2.30.7's net_ib, one send comm + one receive comm, one device, no
 * GPU flush: the ibv_reg_mr lengths (CTS FIFO 128 KiB + put-signal
 * scratchpad 8 B + the sender's completion-record shadow 8 KiB; the
 * receiver's CTS FIFO shadow 128 KiB + completion records 40 KiB) ...
 */
#define NCCL_IB_REG_BYTES 311304ll
/* ... the pages they span at the least (32 + 1 + 2 + 32 + 10) ... */
#define NCCL_IB_PINNED_BYTES (77ll * 4096)
/*
 * ... and the queues as mlx5 sizes them: the sender's QP (512 send WRs of
 * 64 B), the receiver's (512 send WRs of 64 B + 256 receive WRs of 16 B),
 * the sender's CQ (256 asked: 512 CQEs of 64 B) and the receiver's (512
 * asked: 1024 CQEs).
 */
#define NCCL_IB_QUEUE_BYTES (32768ll + 36864 + 32768 + 65536)
/*
 * Where the device can register GPU memory NCCL adds a flush QP (256 send
 * WRs of 64 B) and a 4-byte flush target (a page), as Rail does its
 * self-connected QP: counted when Rail made one (3 QPs per connection).
 */
#define NCCL_IB_FLUSH_REG 4ll
#define NCCL_IB_FLUSH_PINNED 4096ll
#define NCCL_IB_FLUSH_QUEUE 16384ll

static const char roce_one[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x gid_tbl_len=16\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

static long long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kib = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void mem_now(struct fvh *F, long long *v)
{
	for (int i = 0; i < FVH_MEM_N; i++)
		v[i] = F->mem(i);
}

static void test_per_connection(void **state)
{
	const char *env = getenv("RAIL_MEM_PAIRS");
	int n = env && atoi(env) > 0 ? atoi(env) : 16;
	void **sc = calloc((size_t)n, sizeof(*sc)), **rc = calloc((size_t)n, sizeof(*rc));
	long long before[FVH_MEM_N], after[FVH_MEM_N], d[FVH_MEM_N], rss0, rss1;
	long long reg = NCCL_IB_REG_BYTES, pinq = NCCL_IB_PINNED_BYTES + NCCL_IB_QUEUE_BYTES;
	struct fvh *F;

	(void)state;
	assert_non_null(sc);
	assert_non_null(rc);
	F = fvh_start(roce_one);
	if (!F->mem)
		fail_msg("%s lacks fv_test_mem: rebuild it (make tests)", fvh_lib);
	/* the listen comm first: only the connections are counted */
	assert_int_equal(rail_net_listen(F->ctx, 0, F->handle, &F->lc), ncclSuccess);
	mem_now(F, before);
	rss0 = rss_kib();
	for (int i = 0; i < n; i++) {
		fvh_connect(F, 0, 0, -1);
		sc[i] = F->sc;
		rc[i] = F->rc;
		F->sc = F->rc = NULL;
	}
	rss1 = rss_kib();
	mem_now(F, after);
	for (int i = 0; i < FVH_MEM_N; i++)
		d[i] = after[i] - before[i];
	print_message("%d connections, per connection: %lld MRs, %lld bytes registered, %lld "
		      "pinned; %lld QPs, %lld queue bytes; %lld CQs, %lld CQ bytes; RSS +%lld KiB\n",
		      n, d[FVH_MEM_MRS] / n, d[FVH_MEM_MR_BYTES] / n, d[FVH_MEM_MR_PINNED] / n,
		      d[FVH_MEM_QPS] / n, d[FVH_MEM_QP_BYTES] / n, d[FVH_MEM_CQS] / n,
		      d[FVH_MEM_CQ_BYTES] / n, (rss1 - rss0) / n);
	if (d[FVH_MEM_QPS] >= 3ll * n) {	/* a flush QP: NCCL's as well */
		reg += NCCL_IB_FLUSH_REG;
		pinq += NCCL_IB_FLUSH_PINNED + NCCL_IB_FLUSH_QUEUE;
	}
	print_message("NCCL IB per connection: %lld bytes registered, %lld pinned and queued\n",
		      reg, pinq);
	/* the pairs work: one message on the first */
	F->sc = sc[0];
	F->rc = rc[0];
	fvh_one_message(F, 7);
	for (int i = 1; i < n; i++) {
		assert_int_equal(rail_net_close_send(sc[i]), ncclSuccess);
		assert_int_equal(rail_net_close_recv(rc[i]), ncclSuccess);
	}
	free(sc);
	free(rc);
	assert_true(d[FVH_MEM_MR_BYTES] > 0 && d[FVH_MEM_QPS] >= 2 * n);
	if (d[FVH_MEM_MR_BYTES] > reg * n)
		fail_msg("%lld bytes registered per connection, NCCL IB's %lld",
			 d[FVH_MEM_MR_BYTES] / n, reg);
	if (d[FVH_MEM_MR_PINNED] + d[FVH_MEM_QP_BYTES] + d[FVH_MEM_CQ_BYTES] > pinq * n)
		fail_msg("%lld bytes pinned and queued per connection, NCCL IB's %lld",
			 (d[FVH_MEM_MR_PINNED] + d[FVH_MEM_QP_BYTES] + d[FVH_MEM_CQ_BYTES]) / n,
			 pinq);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_per_connection, fvh_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_mem: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_mem: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
