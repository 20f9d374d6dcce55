/*
 * nccl-net-rail unit tests on the fake verbs provider: what changes while
 * the plugin runs (issue 10, defects 6 and 7).
 *
 * - The GID is resolved per connection: a GID table change (the fake's
 *   fv_test_set_gid, with or without the kernel's GID_CHANGE event) is seen
 *   by the next connection, in its RTR address vector; the async thread
 *   logs old -> new, and warns when no usable GID is left.
 * - PORT_ERR (fv_test_port_state): listen, connect and accept on that port
 *   fail with a named error until PORT_ACTIVE; a comm using it fails at its
 *   next call with the named error.
 * - deregMr on NCCL's service thread while test() runs on the progress
 *   thread: deregMr changes no QP state and reads no request; a buffer
 *   deregistered with a request in flight fails the comm at its next call,
 *   on the progress thread. The concurrent test is meant for ThreadSanitizer
 *   (make BUILD=build-tsan SAN=thread OPT=-O1 ...), where the old deregMr
 *   reported a race on the request pool.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

static const char roce_one[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

/* ---- defect 7: deregMr against a running test() ----------------------------- */

/*
 * A buffer deregistered while its receive is in flight (an abort): deregMr
 * changes no QP state (that is the progress thread's); the comm fails at
 * its next call, which stops the QPs, with a WARN naming deregMr.
 */
static void test_dereg_inflight_fails_next_call(void **state)
{
	static char rbuf[8192];
	struct fvh *F;
	void *rmh = NULL, *rreq = NULL;
	void *data[1] = { rbuf }, *mhs[1];
	size_t sizes[1] = { sizeof(rbuf) };
	int tags[1] = { 3 }, done = 0, got[1], mark, logmark;

	(void)state;
	F = fvh_start(roce_one);
	fvh_connect(F, 0, 0, -1);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), 0);
	assert_non_null(rreq);
	mark = fvh_calls_mark(F);
	logmark = fvh_log_mark();
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	if (fvh_calls(F, mark, "ibv_modify_qp", "state=ERR", NULL, NULL))
		fail_msg("deregMr changed QP state (a test() may be running on another thread)");
	assert_int_not_equal(rail_net_test(rreq, &done, got), ncclSuccess);
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_WARN, "deregMr", "in flight"));
	assert_true(fvh_calls(F, mark, "ibv_modify_qp", "state=ERR", NULL, NULL) > 0);
	fvh_stop(F);
}

struct reg_loop {
	struct fvh *F;
	int iters;
	int failed;
};

static char churn_buf[4][16384] __attribute__((aligned(4096)));

/* NCCL's service thread: register and deregister other buffers on both comms. */
static void *reg_loop_main(void *arg)
{
	struct reg_loop *L = arg;

	for (int i = 0; i < L->iters && !L->failed; i++) {
		void *comm = i & 1 ? L->F->sc : L->F->rc, *mh = NULL;

		if (rail_net_reg_mr(comm, churn_buf[i & 3], sizeof(churn_buf[0]), NCCL_PTR_HOST,
				    &mh) != ncclSuccess ||
		    rail_net_dereg_mr(comm, mh) != ncclSuccess)
			L->failed = 1;
	}
	return NULL;
}

/* One message through irecv/isend/test on this (progress) thread. */
static int one_message(struct fvh *F, char *sbuf, char *rbuf, size_t size, void *smh, void *rmh,
		       int tag)
{
	void *data[1] = { rbuf }, *mhs[1] = { rmh }, *sreq = NULL, *rreq = NULL;
	size_t sizes[1] = { size };
	int tags[1] = { tag }, sdone = 0, rdone = 0, got[1] = { 0 };
	uint64_t deadline = rail_now_ns() + 10ull * 1000000000ull;

	while ((!sreq || !rreq) && rail_now_ns() < deadline) {
		if (!rreq && rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq) != ncclSuccess)
			return -1;
		if (!sreq && rail_net_isend(F->sc, sbuf, size, tag, smh, &sreq) != ncclSuccess)
			return -2;
	}
	while ((!sdone || !rdone) && rail_now_ns() < deadline) {
		if (!rdone && rail_net_test(rreq, &rdone, got) != ncclSuccess)
			return -3;
		if (!sdone && rail_net_test(sreq, &sdone, NULL) != ncclSuccess)
			return -4;
	}
	if (!sdone || !rdone)
		return -5;
	return got[0] == (int)size && !memcmp(sbuf, rbuf, size) ? 0 : -6;
}

static void test_dereg_concurrent_with_test(void **state)
{
	static char sbuf[65536], rbuf[65536];
	struct fvh *F;
	struct reg_loop L;
	pthread_t t;
	void *smh = NULL, *rmh = NULL;
	int err = 0, n = 0;

	(void)state;
	F = fvh_start(roce_one);
	fvh_connect(F, 0, 0, -1);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	L.F = F;
	L.iters = 2000;
	L.failed = 0;
	assert_int_equal(pthread_create(&t, NULL, reg_loop_main, &L), 0);
	for (n = 0; n < 400 && !err; n++) {
		size_t size = n % 3 == 0 ? 64 : n % 3 == 1 ? 3000 : sizeof(sbuf);

		memset(sbuf, n & 0xff, size);
		memset(rbuf, 0, size);
		err = one_message(F, sbuf, rbuf, size, smh, rmh, n & 7);
	}
	pthread_join(t, NULL);
	if (err) {
		fvh_log_dump();
		fail_msg("message %d failed (%d) while another thread registered buffers", n - 1,
			 err);
	}
	assert_false(L.failed);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_stop(F);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_dereg_inflight_fails_next_call, fvh_teardown),
		cmocka_unit_test_teardown(test_dereg_concurrent_with_test, fvh_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_events: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_events: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
