/*
 * nccl-net-rail unit tests on real verbs (Soft-RoCE in the rxe guest, or any
 * RDMA host): one process, the receiver on device 0 and the sender on
 * device 1 (or 0), driven through src/api.h like a shim would. Covers data
 * transfer, grouped receives, the flush path, and injected failures of
 * ibv_reg_mr, ibv_create_qp, ibv_modify_qp and ibv_post_send: each must give
 * a named error (call, errno text, device:port, QP, peer) and leave no verbs
 * object behind (the wrapper table counts them).
 *
 * Without an RDMA device every test is skipped, unless RAIL_TEST_REQUIRE_RDMA=1
 * (the rxe guest sets it) makes that a failure.
 */
#include "unit.h"

#include <errno.h>

#include "api.h"
#include "handle.h"
#include "ib/ib_verbs.h"
#include "param.h"
#include "rail.h"

#define NET_ABI 12

struct live {
	void *ctx;
	int ndev, dev_recv, dev_send;
	void *lc, *sc, *rc;
	ncclResult_t conn_res, acc_res;
};

static int have_rdma(void)
{
	char why[256] = "";

	if (rail_verbs_load(why, sizeof(why)) == 0) {
		struct ibv_device **l;
		int n = 0;

		l = rail_ibv.get_device_list(&n);
		if (l)
			rail_ibv.free_device_list(l);
		rail_verbs_unload();
		if (n > 0)
			return 1;
		snprintf(why, sizeof(why), "no RDMA device");
	}
	if (getenv("RAIL_TEST_REQUIRE_RDMA") && atoi(getenv("RAIL_TEST_REQUIRE_RDMA")))
		fail_msg("RAIL_TEST_REQUIRE_RDMA=1 but %s", why);
	print_message("skipping: %s\n", why);
	return 0;
}

static void live_init(struct live *L, const char *fault_env)
{
	memset(L, 0, sizeof(*L));
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	if (fault_env)
		setenv("NCCL_RAIL_IB_FAULT", fault_env, 1);
	else
		unsetenv("NCCL_RAIL_IB_FAULT");
	rail_params_reload();
	assert_int_equal(rail_net_init(&L->ctx, 1, -1, NULL, NET_ABI), ncclSuccess);
	unit_log_capture();
	assert_int_equal(rail_net_devices(&L->ndev), ncclSuccess);
	L->dev_recv = 0;
	L->dev_send = L->ndev > 1 ? 1 : 0;
}

static void live_fini(struct live *L)
{
	struct rail_verbs_counts k;

	if (L->sc)
		assert_int_equal(rail_net_close_send(L->sc), ncclSuccess);
	if (L->rc)
		assert_int_equal(rail_net_close_recv(L->rc), ncclSuccess);
	if (L->lc)
		assert_int_equal(rail_net_close_listen(L->lc), ncclSuccess);
	unit_log_release();
	assert_int_equal(rail_net_finalize(L->ctx), ncclSuccess);
	unsetenv("NCCL_RAIL_IB_FAULT");
	rail_verbs_counts(&k);
	if (k.pd || k.mr || k.cq || k.qp || k.ctx)
		fail_msg("verbs objects left after finalize: %d PD, %d MR, %d CQ, %d QP, %d contexts",
			 k.pd, k.mr, k.cq, k.qp, k.ctx);
}

/* Listen on dev_recv, connect from dev_send; both sides polled in this thread. */
static void live_connect(struct live *L)
{
	uint8_t handle[RAIL_HANDLE_SIZE], copy[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 60ull * 1000000000ull;

	assert_int_equal(rail_net_listen(L->ctx, L->dev_recv, handle, &L->lc), ncclSuccess);
	memcpy(copy, handle, sizeof(copy));
	L->conn_res = L->acc_res = ncclSuccess;
	while ((!L->sc || !L->rc) && rail_now_ns() < deadline) {
		if (!L->sc && L->conn_res == ncclSuccess)
			L->conn_res = rail_net_connect(L->ctx, L->dev_send, -1, copy, &L->sc);
		if (!L->rc && L->acc_res == ncclSuccess)
			L->acc_res = rail_net_accept(L->lc, &L->rc);
		if (L->conn_res != ncclSuccess && L->acc_res != ncclSuccess)
			break;
		if (L->conn_res != ncclSuccess && !L->rc && rail_now_ns() + 50ull * 1000000000ull >
								deadline)
			break;
	}
}

static ncclResult_t wait_req(void *req, int *sizes)
{
	uint64_t deadline = rail_now_ns() + 60ull * 1000000000ull;
	int done = 0;

	while (!done) {
		ncclResult_t r = rail_net_test(req, &done, sizes);

		if (r != ncclSuccess)
			return r;
		if (rail_now_ns() > deadline)
			fail_msg("request %p did not complete within 60 s", req);
	}
	return ncclSuccess;
}

static void *post_until(int is_send, struct live *L, void *buf, size_t size, int tag, void *mh)
{
	void *req = NULL;
	uint64_t deadline = rail_now_ns() + 60ull * 1000000000ull;

	while (!req && rail_now_ns() < deadline) {
		ncclResult_t r;

		if (is_send) {
			r = rail_net_isend(L->sc, buf, size, tag, mh, &req);
		} else {
			size_t sz = size;
			void *d[1] = { buf }, *m[1] = { mh };
			int t[1] = { tag };

			r = rail_net_irecv(L->rc, 1, d, &sz, t, m, &req);
		}
		assert_int_equal(r, ncclSuccess);
	}
	assert_non_null(req);
	return req;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 31 + i * 7);
}

static void test_transfer(void **state)
{
	static const size_t sizes[] = { 0, 1, 4096, 65537, 1 << 20 };
	size_t big = 1 << 20;
	uint8_t *sbuf = malloc(big), *rbuf = malloc(big + 64);
	void *smh = NULL, *rmh = NULL;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.sc);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.sc, sbuf, big, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.rc, rbuf, big + 64, RAIL_PTR_HOST, &rmh), ncclSuccess);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(sizes); i++) {
		void *rr, *sr;
		int got = -1, sent = -1;

		fill(sbuf, sizes[i], (unsigned)i);
		memset(rbuf, 0xee, big + 64);
		rr = post_until(0, &L, rbuf, big, 7, rmh);
		sr = post_until(1, &L, sbuf, sizes[i], 7, smh);
		assert_int_equal(wait_req(sr, &sent), ncclSuccess);
		assert_int_equal(wait_req(rr, &got), ncclSuccess);
		assert_int_equal(got, (int)sizes[i]);
		assert_memory_equal(rbuf, sbuf, sizes[i]);
		assert_int_equal(rbuf[sizes[i]], 0xee);
	}
	assert_int_equal(rail_net_dereg_mr(L.sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L.rc, rmh), ncclSuccess);
	live_fini(&L);
	free(sbuf);
	free(rbuf);
}

static void test_grouped_and_flush(void **state)
{
	uint8_t *sbuf = malloc(3 * 8192), *rbuf = malloc(3 * 8192);
	void *smh = NULL, *rmh = NULL, *rr = NULL, *fr = NULL, *sr[3];
	size_t rsz[3] = { 8192, 8192, 8192 };
	int tags[3] = { 11, 12, 13 }, got[3], fsz[3];
	void *d[3], *m[3];
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	setenv("NCCL_RAIL_IB_FLUSH_HOST", "1", 1);
	live_init(&L, NULL);
	unsetenv("NCCL_RAIL_IB_FLUSH_HOST");
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.sc, sbuf, 3 * 8192, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.rc, rbuf, 3 * 8192, RAIL_PTR_HOST, &rmh), ncclSuccess);
	for (int i = 0; i < 3; i++) {
		d[i] = rbuf + i * 8192;
		m[i] = rmh;
		fill(sbuf + i * 8192, 8192, 100u + (unsigned)i);
	}
	while (!rr)
		assert_int_equal(rail_net_irecv(L.rc, 3, d, rsz, tags, m, &rr), ncclSuccess);
	/* Sends in another tag order than the receive: tags pick the buffer. */
	sr[0] = post_until(1, &L, sbuf + 2 * 8192, 100, 13, smh);
	sr[1] = post_until(1, &L, sbuf, 8192, 11, smh);
	sr[2] = post_until(1, &L, sbuf + 8192, 0, 12, smh);
	for (int i = 0; i < 3; i++)
		assert_int_equal(wait_req(sr[i], &got[0]), ncclSuccess);
	assert_int_equal(wait_req(rr, got), ncclSuccess);
	assert_int_equal(got[0], 8192);
	assert_int_equal(got[1], 0);
	assert_int_equal(got[2], 100);
	assert_memory_equal(rbuf, sbuf, 8192);
	assert_memory_equal(rbuf + 2 * 8192, sbuf + 2 * 8192, 100);
	/* The flush path: an RDMA read on the self-connected QP. */
	fsz[0] = got[0];
	fsz[1] = got[1];
	fsz[2] = got[2];
	assert_int_equal(rail_net_iflush(L.rc, 3, d, fsz, m, &fr), ncclSuccess);
	assert_non_null(fr);
	assert_int_equal(wait_req(fr, NULL), ncclSuccess);
	/* Nothing to flush: no request. */
	fsz[0] = fsz[1] = fsz[2] = 0;
	fr = (void *)1;
	assert_int_equal(rail_net_iflush(L.rc, 3, d, fsz, m, &fr), ncclSuccess);
	assert_null(fr);
	rail_net_dereg_mr(L.sc, smh);
	rail_net_dereg_mr(L.rc, rmh);
	live_fini(&L);
	free(sbuf);
	free(rbuf);
}

static void test_fault_reg_mr(void **state)
{
	uint8_t *buf = malloc(65536);
	void *mh = NULL;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_verbs_fault_arm("ibv_reg_mr:ENOMEM:1"), 0);
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 65536, RAIL_PTR_HOST, &mh), ncclSystemError);
	assert_null(mh);
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_reg_mr", "Cannot allocate memory");
	unit_assert_logged2(RAIL_LOG_WARN, "peer", "ulimit -l");
	/* The next registration works (only the first call was failed). */
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 65536, RAIL_PTR_HOST, &mh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L.rc, mh), ncclSuccess);
	rail_verbs_fault_clear();
	live_fini(&L);
	free(buf);
}

static void connect_fails(const char *fault, const char *call, const char *errtext)
{
	struct live L;

	live_init(&L, fault);
	live_connect(&L);
	if (L.conn_res == ncclSuccess && L.acc_res == ncclSuccess)
		fail_msg("%s: connect and accept both succeeded", fault);
	assert_true(rail_verbs_faults_injected() > 0);
	unit_assert_logged2(RAIL_LOG_WARN, call, errtext);
	unit_assert_logged2(RAIL_LOG_WARN, call, "peer");
	unit_assert_logged2(RAIL_LOG_WARN, call, ":1");
	live_fini(&L);
}

static void test_fault_create_qp(void **state)
{
	(void)state;
	if (!have_rdma())
		skip();
	/* Through the environment variable, as rail-bench or the conformance suite would. */
	connect_fails("ibv_create_qp:ENOMEM:1", "ibv_create_qp", "Cannot allocate memory");
}

static void test_fault_modify_qp(void **state)
{
	(void)state;
	if (!have_rdma())
		skip();
	/* Receiver INIT (1), sender INIT (2), sender RTR (3). */
	connect_fails("ibv_modify_qp:EINVAL:3", "ibv_modify_qp(RTR)", "Invalid argument");
	unit_log_capture();
	unit_log_release();
	connect_fails("ibv_modify_qp:ETIMEDOUT:1", "ibv_modify_qp(INIT)", "timed out");
}

static void test_fault_post_send(void **state)
{
	uint8_t *buf = malloc(8192);
	void *smh = NULL, *rmh = NULL, *req = NULL;
	size_t sz = 4096;
	void *d[1] = { buf };
	int tag = 3;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 4096, RAIL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.sc, buf + 4096, 4096, RAIL_PTR_HOST, &smh), ncclSuccess);
	/* The receiver's clear-to-send write fails. */
	assert_int_equal(rail_verbs_fault_arm("ibv_post_send:EIO:1"), 0);
	assert_int_not_equal(rail_net_irecv(L.rc, 1, d, &sz, &tag, &rmh, &req), ncclSuccess);
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(clear-to-send)", "Input/output error");
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(clear-to-send)", "qp 0x");
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(clear-to-send)", "to peer");
	/* The comm stays failed: later calls return an error, never hang. */
	req = NULL;
	assert_int_not_equal(rail_net_irecv(L.rc, 1, d, &sz, &tag, &rmh, &req), ncclSuccess);
	rail_verbs_fault_clear();
	rail_net_dereg_mr(L.rc, rmh);
	rail_net_dereg_mr(L.sc, smh);
	live_fini(&L);
	free(buf);
}

static void test_fault_post_send_data(void **state)
{
	uint8_t *buf = malloc(8192);
	void *smh = NULL, *rmh = NULL, *rr = NULL, *sr = NULL;
	uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull;
	ncclResult_t res = ncclSuccess;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 4096, RAIL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.sc, buf + 4096, 4096, RAIL_PTR_HOST, &smh), ncclSuccess);
	rr = post_until(0, &L, buf, 4096, 5, rmh);
	assert_int_equal(rail_verbs_fault_arm("ibv_post_send:EIO:1"), 0);
	/* The sender's data write fails once the clear-to-send has arrived. */
	while (!sr && res == ncclSuccess && rail_now_ns() < deadline)
		res = rail_net_isend(L.sc, buf + 4096, 4096, 5, smh, &sr);
	assert_int_not_equal(res, ncclSuccess);
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(RDMA write)", "Input/output error");
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(RDMA write)", "to peer");
	rail_verbs_fault_clear();
	(void)rr;
	rail_net_dereg_mr(L.rc, rmh);
	rail_net_dereg_mr(L.sc, smh);
	live_fini(&L);
	free(buf);
}

static void test_wrong_nonce_refused(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE], copy[RAIL_HANDLE_SIZE];
	uint64_t deadline;
	struct rail_handle h;
	char why[128];
	struct live L;
	ncclResult_t cr = ncclSuccess;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	assert_int_equal(rail_net_listen(L.ctx, L.dev_recv, handle, &L.lc), ncclSuccess);
	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	h.nonce ^= 0x5a5a;
	assert_int_equal(rail_handle_encode(&h, copy, sizeof(copy)), 0);
	deadline = rail_now_ns() + 30ull * 1000000000ull;
	while (cr == ncclSuccess && !L.sc && rail_now_ns() < deadline) {
		cr = rail_net_connect(L.ctx, L.dev_send, -1, copy, &L.sc);
		assert_int_equal(rail_net_accept(L.lc, &L.rc), ncclSuccess);
		assert_null(L.rc);
	}
	assert_int_not_equal(cr, ncclSuccess);
	unit_assert_logged2(RAIL_LOG_WARN, "refused", "nonce");
	live_fini(&L);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_transfer),
		cmocka_unit_test(test_grouped_and_flush),
		cmocka_unit_test(test_fault_reg_mr),
		cmocka_unit_test(test_fault_create_qp),
		cmocka_unit_test(test_fault_modify_qp),
		cmocka_unit_test(test_fault_post_send),
		cmocka_unit_test(test_fault_post_send_data),
		cmocka_unit_test(test_wrong_nonce_refused),
	};

	/*
	 * Decide once, before any test allocates: a skip() inside a test
	 * would leave its buffers behind for LeakSanitizer to report.
	 */
	if (getenv("RAIL_TEST_REQUIRE_RDMA") && atoi(getenv("RAIL_TEST_REQUIRE_RDMA")))
		return cmocka_run_group_tests(tests, NULL, NULL);
	if (!have_rdma()) {
		printf("test_ib_live: all %zu tests skipped: no RDMA device (they run in the rxe "
		       "guest: make test-rxe)\n", sizeof(tests) / sizeof(tests[0]));
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
