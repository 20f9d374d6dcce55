/*
 * nccl-net-rail unit tests on real verbs (Soft-RoCE in the rxe guest, or any
 * RDMA host): one process, the receiver on device 0 and the sender on
 * device 1 (or 0), driven through src/api.h like a shim would. Covers data
 * transfer, grouped receives, the flush path, the eager path (mixed small
 * and large messages, sender ahead of the receiver, grouped receives with
 * repeated tags, credit exhaustion while the receiver posts late, a GPU
 * buffer reached through the loopback copy, sends larger than their
 * receive; then again with each protocol of the ring forced,
 * RAIL_TEST_EAGER_ORDERS), and injected failures of ibv_reg_mr, ibv_create_qp,
 * ibv_modify_qp and ibv_post_send: each must give a named error (call,
 * errno text, device:port, QP, peer) and leave no verbs object behind (the
 * wrapper table counts them).
 *
 * Without an RDMA device every test is skipped, unless RAIL_TEST_REQUIRE_RDMA=1
 * (the rxe guest sets it) makes that a failure.
 */
#include "unit.h"

#include <errno.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "ib/ib.h"
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

/*
 * With NCCL_RAIL_IB_EAGER_ORDER forced, the receiver logged that protocol
 * for the ring (the sender learns it from the first credit word, at its
 * first eager send; a sender on the other protocol would not deliver).
 */
static void check_eager_order(void)
{
	const char *o = getenv("NCCL_RAIL_IB_EAGER_ORDER");
	const char *want = o && !strcmp(o, "safe")	? "eager ring order-safe"
			   : o && !strcmp(o, "inorder") ? "eager ring in-order"
							: NULL;

	if (want && !unit_log_has(RAIL_LOG_INFO, want)) {
		unit_log_dump();
		fail_msg("NCCL_RAIL_IB_EAGER_ORDER=%s, but the receiver did not log '%s'", o, want);
	}
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
	if (L->sc && L->rc)
		check_eager_order();
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
	/* Receiver INIT (1), sender INIT (2), sender RTR (3). EINVAL is not retried. */
	connect_fails("ibv_modify_qp:EINVAL:3", "ibv_modify_qp(RTR)", "Invalid argument");
	unit_log_capture();
	unit_log_release();
	/* One attempt (NCCL_IB_MQP_RETRY_CNT=0): a single ETIMEDOUT fails the connect, named. */
	setenv("NCCL_IB_MQP_RETRY_CNT", "0", 1);
	connect_fails("ibv_modify_qp:ETIMEDOUT:1", "ibv_modify_qp(INIT)", "timed out");
	unsetenv("NCCL_IB_MQP_RETRY_CNT");
}

/*
 * With the default retries (NCCL_IB_MQP_RETRY_*), an ETIMEDOUT of the
 * sender's RTR that clears on the next try costs a retry, logged, not the
 * connection (test_ib_mqp.c has the rest, on the fake provider).
 */
static void test_fault_modify_qp_retried(void **state)
{
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "10", 1);
	live_init(&L, "ibv_modify_qp:ETIMEDOUT:3");
	live_connect(&L);
	unsetenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC");
	if (!L.sc || !L.rc)
		unit_log_dump();
	assert_non_null(L.sc);
	assert_non_null(L.rc);
	unit_assert_logged2(RAIL_LOG_INFO, "ibv_modify_qp(RTR)", "attempt 1/35, retrying in 10 ms");
	unit_assert_logged2(RAIL_LOG_INFO, "ibv_modify_qp(RTR)", "succeeded at attempt 2");
	live_fini(&L);
}

static void test_fault_post_send(void **state)
{
	uint8_t *buf = malloc(8192);
	void *smh = NULL, *rmh = NULL, *req = NULL;
	size_t sz = 4096 + 1;	/* more than an eager message: the CTS goes at once */
	void *d[1] = { buf };
	int tag = 3;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 4097, RAIL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.sc, buf + 4097, 4095, RAIL_PTR_HOST, &smh), ncclSuccess);
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
	uint8_t *buf = malloc(3 * 8192);
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
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 8192, RAIL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.sc, buf + 8192, 2 * 8192, RAIL_PTR_HOST, &smh),
			 ncclSuccess);
	/* An eager write fails at isend. */
	assert_int_equal(rail_verbs_fault_arm("ibv_post_send:EIO:1"), 0);
	assert_int_not_equal(rail_net_isend(L.sc, buf + 8192, 100, 5, smh, &sr), ncclSuccess);
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(eager RDMA write", "Input/output error");
	unit_assert_logged2(RAIL_LOG_WARN, "ibv_post_send(eager RDMA write", "to peer");
	rail_verbs_fault_clear();
	rail_net_dereg_mr(L.rc, rmh);
	rail_net_dereg_mr(L.sc, smh);
	live_fini(&L);

	/* The sender's data write fails once the clear-to-send has arrived. */
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.rc, buf, 8192, RAIL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.sc, buf + 8192, 2 * 8192, RAIL_PTR_HOST, &smh),
			 ncclSuccess);
	rr = post_until(0, &L, buf, 8192, 5, rmh);
	/*
	 * Let the receiver's clear-to-send land first: a sender that finds none
	 * for 2 ms posts a want, and the fault would hit that write instead
	 * (seen in the rxe guest under load).
	 */
	usleep(500000);
	assert_int_equal(rail_verbs_fault_arm("ibv_post_send:EIO:1"), 0);
	sr = NULL;
	while (!sr && res == ncclSuccess && rail_now_ns() < deadline)
		res = rail_net_isend(L.sc, buf + 8192, 8192, 5, smh, &sr);
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

/* ---- the eager path ---------------------------------------------------------- */

/*
 * A stream of n messages on one connection, message i (tag `tag`) of
 * sizes[i] bytes into a receive of rooms[i] bytes, at most `window` sends
 * and receives in flight. recv_late: the receiver posts nothing until the
 * sender is refused (it got ahead). Checks sizes, bytes and the poison
 * after each message. Returns how many sends were accepted before the first
 * refusal when recv_late.
 */
struct stream {
	int n, window, recv_late, tag;	/* window: sends in flight; receives: at most 32 */
	const size_t *sizes, *rooms;
};

static void stream_bufs(const struct stream *st, size_t *soff, size_t *roff, size_t *stot,
			size_t *rtot)
{
	*stot = *rtot = 0;
	for (int i = 0; i < st->n; i++) {
		soff[i] = *stot;
		roff[i] = *rtot;
		*stot += st->sizes[i] + 64;
		*rtot += st->rooms[i] + 64;
	}
}

static int stream_run(struct live *L, const struct stream *st)
{
	size_t soff[256], roff[256], stot, rtot;
	void *sreq[256] = { 0 }, *rreq[256] = { 0 }, *smh = NULL, *rmh = NULL;
	int sdone[256] = { 0 }, rdone[256] = { 0 }, ns = 0, nr = 0, ds = 0, dr = 0, ahead = -1;
	uint64_t deadline = rail_now_ns() + 60ull * 1000000000ull;
	uint8_t *sbuf, *rbuf;

	assert_true(st->n <= 256);
	stream_bufs(st, soff, roff, &stot, &rtot);
	sbuf = malloc(stot);
	rbuf = malloc(rtot);
	for (int i = 0; i < st->n; i++)
		fill(sbuf + soff[i], st->sizes[i], 1000u + (unsigned)i);
	memset(rbuf, 0xee, rtot);
	assert_int_equal(rail_net_reg_mr(L->sc, sbuf, stot, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L->rc, rbuf, rtot, RAIL_PTR_HOST, &rmh), ncclSuccess);
	while (ds < st->n || dr < st->n) {
		if (rail_now_ns() > deadline)
			fail_msg("stream stuck: %d/%d sends posted (%d done), %d/%d receives posted "
				 "(%d done)", ns, st->n, ds, nr, st->n, dr);
		while (ns < st->n && ns - ds < st->window) {
			assert_int_equal(rail_net_isend(L->sc, sbuf + soff[ns], st->sizes[ns], st->tag,
							smh, &sreq[ns]), ncclSuccess);
			if (!sreq[ns]) {
				if (ahead < 0)
					ahead = ns;
				break;
			}
			ns++;
		}
		while (nr < st->n && nr - dr < RAIL_MIN(st->window, RAIL_MAX_REQUESTS) &&
		       (!st->recv_late || ahead >= 0)) {
			void *d[1] = { rbuf + roff[nr] }, *m[1] = { rmh };
			size_t sz = st->rooms[nr];
			int t[1] = { st->tag };

			assert_int_equal(rail_net_irecv(L->rc, 1, d, &sz, t, m, &rreq[nr]),
					 ncclSuccess);
			if (!rreq[nr])
				break;
			nr++;
		}
		for (int i = 0; i < ns; i++) {
			int d = 0, got = -1;

			if (sdone[i])
				continue;
			assert_int_equal(rail_net_test(sreq[i], &d, &got), ncclSuccess);
			if (d) {
				sdone[i] = 1;
				ds++;
			}
		}
		for (int i = 0; i < nr; i++) {
			int d = 0, got = -1;

			if (rdone[i])
				continue;
			assert_int_equal(rail_net_test(rreq[i], &d, &got), ncclSuccess);
			if (!d)
				continue;
			rdone[i] = 1;
			dr++;
			assert_int_equal(got, (int)st->sizes[i]);
			assert_memory_equal(rbuf + roff[i], sbuf + soff[i], st->sizes[i]);
			assert_int_equal(rbuf[roff[i] + st->sizes[i]], 0xee);
		}
	}
	assert_int_equal(rail_net_dereg_mr(L->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L->rc, rmh), ncclSuccess);
	free(sbuf);
	free(rbuf);
	return ahead;
}

/* Small and large messages mixed, the receiver first, then the sender ahead. */
static void test_eager_mixed(void **state)
{
	static const size_t mix[] = { 8, 0, 4096, 4097, 100, 65536, 1, 1000, 300000, 17 };
	size_t sizes[80], rooms[80];
	struct stream st = { .n = 80, .window = 16, .sizes = sizes, .rooms = rooms, .tag = 9 };
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	for (int i = 0; i < 80; i++) {
		sizes[i] = mix[(i * 3) % RAIL_ARRAY_SIZE(mix)];
		/* some receives larger than the message: small ones then get a CTS too */
		rooms[i] = i % 4 == 0 ? sizes[i] + 5000 : i % 4 == 1 ? sizes[i] + 10 : sizes[i];
	}
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	stream_run(&L, &st);
	st.recv_late = 1;
	st.window = 32;
	stream_run(&L, &st);
	live_fini(&L);
}

/*
 * The receiver posts nothing while the sender sends 200 small messages: the
 * ring holds RAIL_IB_EAGER_SLOTS (16), the next is refused (no credits) and
 * asks for them; then
 * receives drain the ring, credits come back, and the rest flows, partly
 * through CTSes the want made the receiver write.
 */
static void test_eager_credits(void **state)
{
	size_t sizes[200], rooms[200];
	struct stream st = { .n = 200, .window = 200, .sizes = sizes, .rooms = rooms, .tag = 4,
			     .recv_late = 1 };
	struct live L;
	int ahead;

	(void)state;
	if (!have_rdma())
		skip();
	for (int i = 0; i < 200; i++)
		sizes[i] = rooms[i] = 8 + (size_t)(i % 7) * 300;
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	/* The first refusal comes when the ring is full. */
	assert_int_equal(stream_run(&L, &st), RAIL_IB_EAGER_SLOTS);
	/*
	 * Again, on a connection whose counters went around: the receiver hands
	 * credits back a quarter of the ring at a time, so up to a quarter less
	 * one slot may still count as used.
	 */
	for (int i = 0; i < 200; i++)
		sizes[i] = rooms[i] = (size_t)(i % 3) * 2000;
	ahead = stream_run(&L, &st);
	assert_true(ahead > RAIL_IB_EAGER_SLOTS - RAIL_IB_EAGER_SLOTS / 4 &&
		    ahead <= RAIL_IB_EAGER_SLOTS);
	live_fini(&L);
}

/* Grouped receives, tags repeated within a group, sends in another order. */
static void grouped_round(struct live *L, int small, uint8_t *sbuf, uint8_t *rbuf, void *smh,
			  void *rmh)
{
	/* two groups of {A, B, A}; buffer j of group g at rbuf + (g * 3 + j) * 70000 */
	static const int gtags[3] = { 21, 22, 21 };
	size_t len[6], room[6];
	int got[2][3], order[6][2];
	void *rr[2], *sr[6];

	for (int i = 0; i < 6; i++) {
		len[i] = small ? 10 + (size_t)i * 700 : 5000 + (size_t)i * 9000;
		room[i] = len[i] + (i == 2 ? 3000 : 0);
		fill(sbuf + i * 70000, len[i], 300u + (unsigned)i);
	}
	memset(rbuf, 0xee, 6 * 70000);
	for (int g = 0; g < 2; g++) {
		void *d[3], *m[3] = { rmh, rmh, rmh };
		size_t sz[3];

		for (int j = 0; j < 3; j++) {
			d[j] = rbuf + (g * 3 + j) * 70000;
			sz[j] = room[g * 3 + j];
		}
		rr[g] = NULL;
		while (!rr[g])
			assert_int_equal(rail_net_irecv(L->rc, 3, d, sz, (int *)gtags, m, &rr[g]),
					 ncclSuccess);
	}
	/*
	 * The k-th send with a tag fills the k-th buffer with that tag. Small:
	 * every A first (the third and fourth belong to group 1, sent before
	 * group 0 has its B), then the B's. Large ones wait for their CTS,
	 * which the sender takes group by group: B before A within a group.
	 */
	if (small) {
		int o[6][2] = { { 0, 0 }, { 0, 2 }, { 1, 0 }, { 1, 2 }, { 0, 1 }, { 1, 1 } };

		memcpy(order, o, sizeof(o));
	} else {
		int o[6][2] = { { 0, 1 }, { 0, 0 }, { 0, 2 }, { 1, 1 }, { 1, 0 }, { 1, 2 } };

		memcpy(order, o, sizeof(o));
	}
	for (int i = 0; i < 6; i++) {
		/* the k-th send with a tag fills the k-th buffer with that tag */
		int g = order[i][0], j = order[i][1];

		sr[i] = post_until(1, L, sbuf + (g * 3 + j) * 70000, len[g * 3 + j], gtags[j], smh);
	}
	for (int i = 0; i < 6; i++)
		assert_int_equal(wait_req(sr[i], &got[0][0]), ncclSuccess);
	for (int g = 0; g < 2; g++) {
		assert_int_equal(wait_req(rr[g], got[g]), ncclSuccess);
		for (int j = 0; j < 3; j++) {
			int b = g * 3 + j;

			assert_int_equal(got[g][j], (int)len[b]);
			assert_memory_equal(rbuf + b * 70000, sbuf + b * 70000, len[b]);
			assert_int_equal(rbuf[b * 70000 + len[b]], 0xee);
		}
	}
}

static void test_eager_grouped(void **state)
{
	uint8_t *sbuf, *rbuf;
	void *smh = NULL, *rmh = NULL;
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	sbuf = malloc(6 * 70000);
	rbuf = malloc(6 * 70000);
	live_init(&L, NULL);
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.sc, sbuf, 6 * 70000, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.rc, rbuf, 6 * 70000, RAIL_PTR_HOST, &rmh), ncclSuccess);
	grouped_round(&L, 1, sbuf, rbuf, smh, rmh);
	grouped_round(&L, 0, sbuf, rbuf, smh, rmh);
	grouped_round(&L, 1, sbuf, rbuf, smh, rmh);
	rail_net_dereg_mr(L.sc, smh);
	rail_net_dereg_mr(L.rc, rmh);
	live_fini(&L);
	free(sbuf);
	free(rbuf);
}

/*
 * Receive buffers the NIC must write (NCCL_RAIL_IB_FLUSH_HOST makes host
 * buffers count as GPU memory): an eager message already in the ring is
 * copied by an RDMA WRITE on the self-connected QP, not by the CPU; then
 * the flush still works.
 */
static void test_eager_gpu_loopback(void **state)
{
	uint8_t *sbuf, *rbuf;
	void *smh = NULL, *rmh = NULL, *sr, *rr, *fr = NULL;
	void *d[1], *m[1];
	int got = -1, fsz[1];
	struct live L;

	(void)state;
	if (!have_rdma())
		skip();
	sbuf = malloc(8192);
	rbuf = malloc(8192);
	d[0] = rbuf;
	setenv("NCCL_RAIL_IB_FLUSH_HOST", "1", 1);
	live_init(&L, NULL);
	unsetenv("NCCL_RAIL_IB_FLUSH_HOST");
	live_connect(&L);
	assert_non_null(L.rc);
	assert_int_equal(rail_net_reg_mr(L.sc, sbuf, 8192, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L.rc, rbuf, 8192, RAIL_PTR_HOST, &rmh), ncclSuccess);
	m[0] = rmh;
	for (int round = 0; round < 3; round++) {
		size_t len = 100 + (size_t)round * 1500;

		fill(sbuf, len, 70u + (unsigned)round);
		memset(rbuf, 0xee, 8192);
		/* The send first: it goes into the ring (no CTS yet). */
		sr = post_until(1, &L, sbuf, len, 3, smh);
		assert_int_equal(wait_req(sr, &got), ncclSuccess);
		rr = post_until(0, &L, rbuf, 4096 + 100, 3, rmh);
		assert_int_equal(wait_req(rr, &got), ncclSuccess);
		assert_int_equal(got, (int)len);
		assert_memory_equal(rbuf, sbuf, len);
		assert_int_equal(rbuf[len], 0xee);
		fsz[0] = got;
		fr = NULL;
		assert_int_equal(rail_net_iflush(L.rc, 1, d, fsz, m, &fr), ncclSuccess);
		assert_non_null(fr);
		assert_int_equal(wait_req(fr, NULL), ncclSuccess);
	}
	rail_net_dereg_mr(L.sc, smh);
	rail_net_dereg_mr(L.rc, rmh);
	live_fini(&L);
	free(sbuf);
	free(rbuf);
}

/*
 * A send larger than its receive: 1000 bytes into 500 (eager: the receiver
 * finds it out), 5000 into 4000 (the sender waits for a CTS that the
 * receiver, with a small buffer, writes only when asked; then refuses).
 */
static void test_eager_send_larger(void **state)
{
	static const size_t send[2] = { 1000, 5000 }, room[2] = { 500, 4000 };
	uint8_t *buf;

	(void)state;
	if (!have_rdma())
		skip();
	buf = malloc(16384);
	for (int k = 0; k < 2; k++) {
		void *smh = NULL, *rmh = NULL, *rr = NULL, *sr = NULL;
		void *d[1] = { buf }, *m[1];
		uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull;
		ncclResult_t sres = ncclSuccess, rres = ncclSuccess;
		size_t sz = room[k];
		int tag = 2, done = 0, got;
		char s1[16], s2buf[16];
		const char *s2 = s2buf;
		struct live L;

		live_init(&L, NULL);
		live_connect(&L);
		assert_non_null(L.rc);
		assert_int_equal(rail_net_reg_mr(L.rc, buf, 8192, RAIL_PTR_HOST, &rmh), ncclSuccess);
		assert_int_equal(rail_net_reg_mr(L.sc, buf + 8192, 8192, RAIL_PTR_HOST, &smh),
				 ncclSuccess);
		memset(buf, 0xee, 8192);
		m[0] = rmh;
		while (!rr)
			assert_int_equal(rail_net_irecv(L.rc, 1, d, &sz, &tag, m, &rr), ncclSuccess);
		/* Drive both sides until the receive fails. */
		while (rres == ncclSuccess && !done && rail_now_ns() < deadline) {
			if (!sr && sres == ncclSuccess)
				sres = rail_net_isend(L.sc, buf + 8192, send[k], tag, smh, &sr);
			rres = rail_net_test(rr, &done, &got);
		}
		assert_int_not_equal(rres, ncclSuccess);
		snprintf(s1, sizeof(s1), "%zu", send[k]);
		snprintf(s2buf, sizeof(s2buf), "%zu", room[k]);
		unit_assert_logged2(RAIL_LOG_WARN, s1, s2);
		/*
		 * The sender is told too: the oversized send, or a later small one
		 * (8 bytes, eager), fails within the deadline. Eager (1000 into 500):
		 * the receiver's refusal in the credit word; larger: the sender
		 * refuses itself against the clear-to-send.
		 */
		unit_log_reset();
		while (sres == ncclSuccess && rail_now_ns() < deadline) {
			int sdone = 0, ssz;

			if (!sr)
				sres = rail_net_isend(L.sc, buf + 8192, 8, tag + 1, smh, &sr);
			else if ((sres = rail_net_test(sr, &sdone, &ssz)) == ncclSuccess && sdone)
				sr = NULL;
		}
		assert_int_not_equal(sres, ncclSuccess);
		if (k == 0)
			unit_assert_logged2(RAIL_LOG_WARN, "refused eager message", s2);
		for (size_t i = room[k]; i < 8192; i++)
			assert_int_equal(buf[i], 0xee);
		rail_net_dereg_mr(L.rc, rmh);
		rail_net_dereg_mr(L.sc, smh);
		live_fini(&L);
	}
	free(buf);
}

/*
 * The peer of one connection goes away (its receive comm closed: its
 * handshake socket closes, as when the process exits): that connection's
 * sender, waiting for a clear-to-send, fails with a WARN naming the peer and
 * the QP within a few seconds; a second connection of the same process
 * keeps moving data. The watchdog of the two-guest runs (a silent host:
 * ETIMEDOUT after NCCL_RAIL_PEER_TIMEOUT) reads the same socket.
 */
static void test_peer_gone_other_comm_works(void **state)
{
	size_t big = 1 << 20;
	uint8_t *sbuf = malloc(big), *rbuf = malloc(big);
	void *smh = NULL, *rmh = NULL, *smh1 = NULL, *req = NULL;
	uint64_t deadline;
	ncclResult_t r = ncclSuccess;
	struct live L, L2;
	int got = -1, sent = -1;

	(void)state;
	live_init(&L, NULL);
	live_connect(&L);
	L2 = L;
	L2.sc = L2.rc = L2.lc = NULL;
	live_connect(&L2);
	assert_non_null(L.sc);
	assert_non_null(L2.sc);
	assert_non_null(L2.rc);
	assert_int_equal(rail_net_reg_mr(L.sc, sbuf, big, RAIL_PTR_HOST, &smh1), ncclSuccess);
	assert_int_equal(rail_net_close_recv(L.rc), ncclSuccess);
	L.rc = NULL;
	unit_log_reset();
	/* 64 KiB: beyond the eager ring, so the send waits for a clear-to-send. */
	deadline = rail_now_ns() + 10ull * 1000000000ull;
	while (r == ncclSuccess && rail_now_ns() < deadline) {
		int done = 0;

		if (!req)
			r = rail_net_isend(L.sc, sbuf, 65536, 3, smh1, &req);
		else
			r = rail_net_test(req, &done, &sent);
	}
	assert_int_equal(r, ncclRemoteError);
	unit_assert_logged2(RAIL_LOG_WARN, "is gone", "qp 0x");
	/*
	 * The failure logged the sender's flight record once: the connection
	 * (peer, device:port, each QP and its state) and what it was doing, the
	 * 64 KiB send of tag 3 that waited for a clear-to-send.
	 */
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "flight record of ib send comm"), 1);
	unit_assert_logged2(RAIL_LOG_WARN, "flight record of ib send comm (peer ", " RTS");
	unit_assert_logged2(RAIL_LOG_WARN, "flight record of ib send comm", "found the peer gone");
	unit_assert_logged2(RAIL_LOG_WARN, "flight: ", "size=65536 tag=3");
	unit_assert_logged2(RAIL_LOG_WARN, "flight: ", "peer gone");
	unit_assert_logged2(RAIL_LOG_WARN, "in flight: send req=", "size=65536 tag=3");
	/* The peer closed its socket: nothing may call that a reset (conformance misuse-eof). */
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "reset by peer"), 0);
	/* The other connection is unaffected. */
	assert_int_equal(rail_net_reg_mr(L2.sc, sbuf, big, RAIL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(L2.rc, rbuf, big, RAIL_PTR_HOST, &rmh), ncclSuccess);
	fill(sbuf, big, 5);
	memset(rbuf, 0, big);
	{
		void *rr = post_until(0, &L2, rbuf, big, 9, rmh);
		void *sr = post_until(1, &L2, sbuf, big, 9, smh);

		assert_int_equal(wait_req(sr, &sent), ncclSuccess);
		assert_int_equal(wait_req(rr, &got), ncclSuccess);
	}
	assert_int_equal(got, (int)big);
	assert_memory_equal(rbuf, sbuf, big);
	assert_int_equal(rail_net_dereg_mr(L2.sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L2.rc, rmh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L.sc, smh1), ncclSuccess);
	assert_int_equal(rail_net_close_send(L2.sc), ncclSuccess);
	assert_int_equal(rail_net_close_recv(L2.rc), ncclSuccess);
	assert_int_equal(rail_net_close_listen(L2.lc), ncclSuccess);
	live_fini(&L);
	free(sbuf);
	free(rbuf);
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
		cmocka_unit_test(test_fault_modify_qp_retried),
		cmocka_unit_test(test_fault_post_send),
		cmocka_unit_test(test_fault_post_send_data),
		cmocka_unit_test(test_eager_mixed),
		cmocka_unit_test(test_eager_credits),
		cmocka_unit_test(test_eager_grouped),
		cmocka_unit_test(test_eager_gpu_loopback),
		cmocka_unit_test(test_eager_send_larger),
		cmocka_unit_test(test_wrong_nonce_refused),
		cmocka_unit_test(test_peer_gone_other_comm_works),
	};
	/*
	 * The eager tests again with each protocol of the ring forced
	 * (NCCL_RAIL_IB_EAGER_ORDER): RAIL_TEST_EAGER_ORDERS, default
	 * "safe,inorder" (a device that reorders writes takes only "safe").
	 */
	const struct CMUnitTest eager_tests[] = {
		cmocka_unit_test(test_fault_post_send_data),
		cmocka_unit_test(test_eager_mixed),
		cmocka_unit_test(test_eager_credits),
		cmocka_unit_test(test_eager_grouped),
		cmocka_unit_test(test_eager_gpu_loopback),
		cmocka_unit_test(test_eager_send_larger),
	};
	const char *orders = getenv("RAIL_TEST_EAGER_ORDERS");
	char list[64], *save = NULL;
	int fails;

	/*
	 * Decide once, before any test allocates: a skip() inside a test
	 * would leave its buffers behind for LeakSanitizer to report.
	 */
	if (!(getenv("RAIL_TEST_REQUIRE_RDMA") && atoi(getenv("RAIL_TEST_REQUIRE_RDMA"))) &&
	    !have_rdma()) {
		printf("test_ib_live: all %zu tests skipped: no RDMA device (they run in the rxe "
		       "guest: make test-rxe)\n", sizeof(tests) / sizeof(tests[0]));
		return 0;
	}
	fails = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(list, sizeof(list), "%s", orders ? orders : "safe,inorder");
	for (char *o = strtok_r(list, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		printf("test_ib_live: the eager tests with NCCL_RAIL_IB_EAGER_ORDER=%s\n", o);
		setenv("NCCL_RAIL_IB_EAGER_ORDER", o, 1);
		fails += cmocka_run_group_tests(eager_tests, NULL, NULL);
	}
	unsetenv("NCCL_RAIL_IB_EAGER_ORDER");
	return fails;
}
