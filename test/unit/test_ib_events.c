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
 * - DEVICE_SPEED_CHANGE (issue 24; the fake's fv_test_port_speed): the
 *   async thread reads each port's speed again, logs old -> new, and
 *   getProperties reports the new one; PORT_ACTIVE reads it again too.
 * - QP_FATAL: the WARN names the QP's state and PSNs (ibv_query_qp).
 */
#include "unit.h"

#include <stdatomic.h>

#include <infiniband/verbs.h>

#include "fv_harness.h"

static const char roce_one[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x gid_tbl_len=16\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

static const char roce_two[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n"
			       "device mlx5_1\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::2 type=v1\n"
			       "gid 1 ::ffff:10.2.0.1 type=v2\n";

/* Every RTR since call-log line `from` uses this local GID index and peer GID. */
static void assert_rtrs(struct fvh *F, int from, int sgid_index, const char *dgid)
{
	char line[FVH_LINE], buf[64];
	int n = fvh_calls(F, from, "ibv_modify_qp", "state=RTR", NULL, NULL);

	if (n == 0)
		fail_msg("no RTR recorded");
	for (int i = 0; i < n; i++) {
		FILE *f = fopen(F->log, "r");
		int k = 0, row = 0;

		assert_non_null(f);
		while (fgets(line, sizeof(line), f)) {
			if (row++ < from || strncmp(line, "ibv_modify_qp ", 14) ||
			    !strstr(line, "state=RTR"))
				continue;
			if (k++ != i)
				continue;
			if (strstr(line, "ret=EINVAL"))
				fail_msg("RTR refused: %s", line);
			assert_int_equal(strtol(fvh_kv(line, "ah.sgid_index", buf, sizeof(buf)),
						NULL, 0), sgid_index);
			assert_string_equal(fvh_kv(line, "ah.dgid", buf, sizeof(buf)), dgid);
		}
		fclose(f);
	}
}

/* ---- defect 6: the GID per connection --------------------------------------- */

static void test_gid_change_new_connection(void **state)
{
	struct fvh *F;
	ncclResult_t lr, cr, ar;
	int mark, logmark;

	(void)state;
	F = fvh_start(roce_one);
	fvh_connect(F, 0, 0, -1);
	assert_rtrs(F, 0, 1, "::ffff:10.1.0.1");
	fvh_close_comms(F);

	/* Re-addressed: the old entry is gone, the new address sits at index 2; no event yet. */
	assert_int_equal(F->set_gid("mlx5_0", 1, 1, NULL, 2), 0);
	assert_int_equal(F->set_gid("mlx5_0", 1, 2, "::ffff:10.1.0.7", 2), 0);
	mark = fvh_calls_mark(F);
	fvh_connect(F, 0, 0, -1);
	assert_rtrs(F, mark, 2, "::ffff:10.1.0.7");
	fvh_close_comms(F);

	/* The kernel's event: the async thread says what changed. */
	logmark = fvh_log_mark();
	assert_int_equal(F->event("mlx5_0", 1, IBV_EVENT_GID_CHANGE), 1);
	if (!fvh_wait_log_from(logmark, NCCL_LOG_INFO, "mlx5_0:1", "::ffff:10.1.0.1 -> ", 5000)) {
		fvh_log_dump();
		fail_msg("no INFO line 'mlx5_0:1 ... ::ffff:10.1.0.1 -> ...' after GID_CHANGE");
	}
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_INFO, "index 2 ::ffff:10.1.0.7", NULL));

	/* No usable GID left: a WARN from the async thread, then connect fails by name. */
	logmark = fvh_log_mark();
	assert_int_equal(F->set_gid("mlx5_0", 1, 2, NULL, 2), 0);
	assert_int_equal(F->event("mlx5_0", 1, IBV_EVENT_GID_CHANGE), 1);
	if (!fvh_wait_log_from(logmark, NCCL_LOG_WARN, "mlx5_0:1", "no usable GID", 5000)) {
		fvh_log_dump();
		fail_msg("no WARN 'no usable GID' after the last GID went");
	}
	logmark = fvh_log_mark();
	assert_false(fvh_try_connect(F, 0, 0, -1, &lr, &cr, &ar));
	assert_int_not_equal(cr, ncclSuccess);
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_WARN, "connect", "mlx5_0:1"));
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_WARN, "no usable GID", NULL));
	fvh_stop(F);
}

/* ---- defect 6: PORT_ERR ----------------------------------------------------- */

static void port_down(struct fvh *F, const char *dev)
{
	int mark = fvh_log_mark();

	assert_int_equal(F->port_state(dev, 1, IBV_PORT_DOWN), 1);
	if (!fvh_wait_log_from(mark, NCCL_LOG_WARN, dev, "went down", 5000)) {
		fvh_log_dump();
		fail_msg("the plugin did not report PORT_ERR on %s:1", dev);
	}
}

static void port_up(struct fvh *F, const char *dev)
{
	int mark = fvh_log_mark();

	assert_int_equal(F->port_state(dev, 1, IBV_PORT_ACTIVE), 1);
	if (!fvh_wait_log_from(mark, NCCL_LOG_INFO, dev, "ACTIVE again", 5000)) {
		fvh_log_dump();
		fail_msg("the plugin did not report PORT_ACTIVE on %s:1", dev);
	}
}

/* The named error: call, device:port, what happened and what to try. */
static void assert_named(int from, const char *call)
{
	if (!fvh_log_count_from(from, NCCL_LOG_WARN, call, "mlx5_0:1") ||
	    !fvh_log_count_from(from, NCCL_LOG_WARN, "PORT_ERR", "ACTIVE")) {
		fvh_log_dump();
		fail_msg("no WARN naming %s, mlx5_0:1, PORT_ERR and what to wait for", call);
	}
}

static void test_port_err_refuses_new_connections(void **state)
{
	struct fvh *F;
	uint8_t handle[RAIL_HANDLE_SIZE], h2[RAIL_HANDLE_SIZE];
	ncclResult_t lr, cr, ar;
	int mark;

	(void)state;
	F = fvh_start(roce_two);
	assert_int_equal(F->ndev, 2);
	assert_int_equal(rail_net_listen(F->ctx, 0, handle, &F->lc2), ncclSuccess);
	port_down(F, "mlx5_0");

	mark = fvh_log_mark();
	assert_int_not_equal(rail_net_listen(F->ctx, 0, h2, &F->lc), ncclSuccess);
	assert_null(F->lc);
	assert_named(mark, "listen");

	mark = fvh_log_mark();
	assert_false(fvh_try_connect(F, 1, 0, -1, &lr, &cr, &ar));
	assert_int_equal(lr, ncclSuccess);
	assert_int_not_equal(cr, ncclSuccess);
	assert_named(mark, "connect");
	fvh_close_comms(F);

	/* The listener made before: a connection to it is refused on accept. */
	F->lc = F->lc2;
	F->lc2 = NULL;
	memcpy(F->handle, handle, sizeof(handle));
	mark = fvh_log_mark();
	assert_false(fvh_try_connect(F, 0, 1, -1, &lr, &cr, &ar));
	assert_int_not_equal(ar, ncclSuccess);
	assert_named(mark, "accept");
	fvh_close_comms(F);

	/* ACTIVE again: new connections work. */
	port_up(F, "mlx5_0");
	fvh_connect(F, 0, 1, -1);
	fvh_close_comms(F);
	fvh_connect(F, 1, 0, -1);
	fvh_stop(F);
}

/*
 * NCCL_IB_DATA_DIRECT=2: one port is two devices (its PCIe and its Data
 * Direct entry); PORT_ERR and PORT_ACTIVE reach both (before: the first only).
 */
static void test_port_err_data_direct_both(void **state)
{
	struct fvh *F;
	uint8_t handle[RAIL_HANDLE_SIZE];

	(void)state;
	setenv("NCCL_IB_DATA_DIRECT", "2", 1);
	F = fvh_start("device mlx5_0 data_direct=/devices/pci0000:00/0000:00:02.0/0000:02:00.0\n"
		      "port 1 link=eth speed=ndr width=4x\n"
		      "gid 0 fe80::1 type=v1\n"
		      "gid 1 ::ffff:10.1.0.1 type=v2\n");
	assert_int_equal(F->ndev, 2);
	port_down(F, "mlx5_0");
	for (int dev = 0; dev < 2; dev++) {
		assert_int_not_equal(rail_net_listen(F->ctx, dev, handle, &F->lc), ncclSuccess);
		assert_null(F->lc);
	}
	port_up(F, "mlx5_0");
	for (int dev = 0; dev < 2; dev++) {
		fvh_connect(F, dev, dev, -1);
		fvh_close_comms(F);
	}
	fvh_stop(F);
}

static int failover_teardown(void **state)
{
	unsetenv("NCCL_RAIL_FAILOVER");
	return fvh_teardown(state);
}

static int dd_teardown(void **state)
{
	unsetenv("NCCL_IB_DATA_DIRECT");
	return fvh_teardown(state);
}

/* NCCL_RAIL_FAILOVER=0: a comm on a port that went down fails (test_ib_move.c: with 1). */
static void test_port_err_fails_running_comm(void **state)
{
	static char sbuf[8192], rbuf[8192];
	struct fvh *F;
	void *smh = NULL, *rmh = NULL, *rreq = NULL, *sreq = NULL;
	void *data[1] = { rbuf }, *mhs[1];
	size_t sizes[1] = { sizeof(rbuf) };
	int tags[1] = { 1 }, done = 0, got[1], mark, i;
	ncclResult_t r = ncclSuccess;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER", "0", 1);
	F = fvh_start(roce_two);
	fvh_connect(F, 1, 0, -1);	/* the sender on mlx5_0 */
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), 0);
	assert_non_null(rreq);
	port_down(F, "mlx5_0");

	/* The sender's next call fails by name... */
	mark = fvh_log_mark();
	r = rail_net_isend(F->sc, sbuf, sizeof(sbuf), 1, smh, &sreq);
	assert_int_not_equal(r, ncclSuccess);
	assert_null(sreq);
	assert_named(mark, "isend");
	/* ...and the receiver on mlx5_1 still works, but not with this sender: untouched here. */
	for (i = 0; i < 16 && !done; i++)
		assert_int_equal(rail_net_test(rreq, &done, got), ncclSuccess);
	assert_false(done);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_close_comms(F);

	/* A receiver on the port that went down: its next test() fails by name. */
	port_up(F, "mlx5_0");
	fvh_connect(F, 0, 1, -1);	/* the receiver on mlx5_0 */
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	rreq = NULL;
	assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), 0);
	assert_non_null(rreq);
	port_down(F, "mlx5_0");
	mark = fvh_log_mark();
	r = rail_net_test(rreq, &done, got);
	assert_int_not_equal(r, ncclSuccess);
	assert_named(mark, "test");
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_stop(F);
}

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
	atomic_int stop;	/* the messages are done */
	int iters;		/* done by the thread */
	int failed;
};

static char churn_buf[4][16384] __attribute__((aligned(4096)));

/* NCCL's service thread: register and deregister other buffers on both comms. */
static void *reg_loop_main(void *arg)
{
	struct reg_loop *L = arg;

	for (int i = 0; !atomic_load(&L->stop) && !L->failed; i++, L->iters++) {
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
	atomic_init(&L.stop, 0);
	L.iters = 0;
	L.failed = 0;
	assert_int_equal(pthread_create(&t, NULL, reg_loop_main, &L), 0);
	for (n = 0; n < 400 && !err; n++) {
		size_t size = n % 3 == 0 ? 64 : n % 3 == 1 ? 3000 : sizeof(sbuf);

		memset(sbuf, n & 0xff, size);
		memset(rbuf, 0, size);
		err = one_message(F, sbuf, rbuf, size, smh, rmh, n & 7);
	}
	atomic_store(&L.stop, 1);
	pthread_join(t, NULL);
	print_message("%d messages while the other thread made %d registrations\n", n, L.iters);
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

/* ---- issue 24: DEVICE_SPEED_CHANGE and the QP-fatal WARN --------------------- */

static const char roce_two_ports[] = "device mlx5_0\n"
				     "port 1 link=eth speed=ndr width=4x\n"
				     "gid 0 fe80::1 type=v1\n"
				     "gid 1 ::ffff:10.1.0.1 type=v2\n"
				     "port 2 link=eth speed=ndr width=4x\n"
				     "gid 0 fe80::2 type=v1\n"
				     "gid 1 ::ffff:10.1.1.1 type=v2\n";

/* The speed getProperties reports for the device called name. */
static int speed_of(struct fvh *F, const char *name)
{
	for (int i = 0; i < F->ndev; i++) {
		struct rail_props p;

		memset(&p, 0, sizeof(p));
		assert_int_equal(rail_net_get_properties(i, &p), ncclSuccess);
		if (p.name && !strcmp(p.name, name))
			return p.speed;
	}
	fail_msg("no device %s among %d", name, F->ndev);
	return -1;
}

static void wait_line(int mark, int level, const char *a, const char *b, const char *what)
{
	if (!fvh_wait_log_from(mark, level, a, b, 5000)) {
		fvh_log_dump();
		fail_msg("no %s line '%s ... %s' (%s)", level == NCCL_LOG_WARN ? "WARN" : "INFO", a,
			 b, what);
	}
}

/*
 * A RoCE LAG lost a member (ibv_query_port_speed answers half), then got it
 * back: each DEVICE_SPEED_CHANGE (mlx5 raises it for the device, port 0) is
 * logged per port with old -> new, and getProperties reports the new speed;
 * the other port, unchanged, keeps its speed and gets no such line.
 */
static void test_speed_change_event(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = fvh_start(roce_two_ports);
	assert_non_null(F->port_speed);
	assert_int_equal(F->ndev, 2);
	assert_int_equal(speed_of(F, "mlx5_0:1"), 400000);
	assert_int_equal(speed_of(F, "mlx5_0:2"), 400000);

	mark = fvh_log_mark();
	assert_int_equal(F->port_speed("mlx5_0", 1, 0, 0, 2000, 1), 1);
	wait_line(mark, NCCL_LOG_WARN, "mlx5_0:1", "400000 -> 200000 Mbps", "a LAG member lost");
	assert_true(fvh_log_count_from(mark, NCCL_LOG_WARN, "mlx5_0:1", "DEVICE_SPEED_CHANGE"));
	assert_int_equal(speed_of(F, "mlx5_0:1"), 200000);
	assert_int_equal(speed_of(F, "mlx5_0:2"), 400000);
	assert_false(fvh_log_count_from(mark, NCCL_LOG_WARN, "mlx5_0:2", NULL));
	assert_false(fvh_log_count_from(mark, NCCL_LOG_INFO, "mlx5_0:2", " -> "));

	mark = fvh_log_mark();
	assert_int_equal(F->port_speed("mlx5_0", 1, 0, 0, -1, 1), 1);
	wait_line(mark, NCCL_LOG_INFO, "mlx5_0:1", "200000 -> 400000 Mbps", "the member back");
	assert_int_equal(speed_of(F, "mlx5_0:1"), 400000);
	fvh_stop(F);
}

/* Without ibv_query_port_speed: the table on active_speed x width, as at init. */
static void test_speed_change_table(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = fvh_start("lib port_speed=no\n"
		      "device mlx5_0\n"
		      "port 1 link=ib speed=ndr width=4x\n"
		      "gid 0 fe80::1\n");
	assert_int_equal(speed_of(F, "mlx5_0"), 400000);
	mark = fvh_log_mark();
	assert_int_equal(F->port_speed("mlx5_0", 1, 0x40 /* HDR */, 0, -1, 1), 1);
	wait_line(mark, NCCL_LOG_WARN, "mlx5_0:1", "400000 -> 200000 Mbps", "NDR to HDR");
	assert_int_equal(speed_of(F, "mlx5_0"), 200000);
	fvh_stop(F);
}

/*
 * The speed of a port that is not ACTIVE is not taken (a down link reads no
 * speed): it is read again at PORT_ACTIVE, which also catches a link that
 * came back at another speed on a kernel without DEVICE_SPEED_CHANGE.
 */
static void test_speed_after_port_active(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = fvh_start(roce_one);
	assert_int_equal(speed_of(F, "mlx5_0"), 400000);
	port_down(F, "mlx5_0");
	mark = fvh_log_mark();
	assert_int_equal(F->port_speed("mlx5_0", 1, 0, 0, 2000, 1), 1);
	wait_line(mark, NCCL_LOG_INFO, "mlx5_0:1", "not ACTIVE", "the event while down");
	assert_int_equal(speed_of(F, "mlx5_0"), 400000);
	mark = fvh_log_mark();
	port_up(F, "mlx5_0");
	wait_line(mark, NCCL_LOG_WARN, "mlx5_0:1", "400000 -> 200000 Mbps", "back at 200G");
	assert_int_equal(speed_of(F, "mlx5_0"), 200000);

	/* no event at all: PORT_ACTIVE alone */
	port_down(F, "mlx5_0");
	assert_int_equal(F->port_speed("mlx5_0", 1, 0, 0, -1, 0), 0);
	mark = fvh_log_mark();
	port_up(F, "mlx5_0");
	wait_line(mark, NCCL_LOG_INFO, "mlx5_0:1", "200000 -> 400000 Mbps", "back at 400G");
	assert_int_equal(speed_of(F, "mlx5_0"), 400000);
	fvh_stop(F);
}

/*
 * QP_FATAL on one of the sender's QPs after some traffic: the WARN names
 * device:port, the QP, its state and PSNs as ibv_query_qp gives them (the
 * fake logs what it will answer), with failover off (the comm fails) and on
 * (it moves to new QPs).
 */
static void qp_fatal_warn(int failover)
{
	static char sbuf[65536], rbuf[65536];
	static const size_t sizes[] = { 64, 3000, 65536, 4096 };
	struct fvh *F;
	void *smh = NULL, *rmh = NULL;
	char line[FVH_LINE], sq[16], rq[16], qp[32], want[96];
	int mark, logmark, qpn;

	setenv("NCCL_RAIL_FAILOVER", failover ? "1" : "0", 1);
	F = fvh_start(roce_two);
	assert_non_null(F->qp_fatal);
	fvh_connect(F, 1, 0, -1);	/* the sender on mlx5_0, the receiver on mlx5_1 */
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(one_message(F, sbuf, rbuf, sizes[i % 4], smh, rmh, i), 0);
	mark = fvh_calls_mark(F);
	logmark = fvh_log_mark();
	qpn = F->qp_fatal("mlx5_0");
	assert_true(qpn > 0);
	assert_int_equal(fvh_calls(F, mark, "test_qp_fatal", NULL, NULL, line), 1);
	fvh_kv(line, "sq_psn", sq, sizeof(sq));
	fvh_kv(line, "rq_psn", rq, sizeof(rq));
	assert_true(strcmp(sq, "0") || strcmp(rq, "0"));	/* traffic moved them */
	snprintf(qp, sizeof(qp), "qp 0x%x", (unsigned)qpn);
	snprintf(want, sizeof(want), "state=ERR sq_psn=%s rq_psn=%s", sq, rq);
	wait_line(logmark, NCCL_LOG_WARN, qp, want, "QP_FATAL");
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_WARN, "mlx5_0:1: async event QP_FATAL",
				       want));
	assert_true(fvh_log_count_from(logmark, NCCL_LOG_WARN, want,
				       failover ? "moves to new QPs" : "fails from now on"));
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_stop(F);
}

static void test_qp_fatal_warn_state_psns(void **state)
{
	(void)state;
	qp_fatal_warn(0);
}

static void test_qp_fatal_warn_state_psns_failover(void **state)
{
	(void)state;
	qp_fatal_warn(1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_gid_change_new_connection, fvh_teardown),
		cmocka_unit_test_teardown(test_port_err_refuses_new_connections, fvh_teardown),
		cmocka_unit_test_teardown(test_port_err_fails_running_comm, failover_teardown),
		cmocka_unit_test_teardown(test_port_err_data_direct_both, dd_teardown),
		cmocka_unit_test_teardown(test_dereg_inflight_fails_next_call, fvh_teardown),
		cmocka_unit_test_teardown(test_dereg_concurrent_with_test, fvh_teardown),
		cmocka_unit_test_teardown(test_speed_change_event, fvh_teardown),
		cmocka_unit_test_teardown(test_speed_change_table, fvh_teardown),
		cmocka_unit_test_teardown(test_speed_after_port_active, fvh_teardown),
		cmocka_unit_test_teardown(test_qp_fatal_warn_state_psns, failover_teardown),
		cmocka_unit_test_teardown(test_qp_fatal_warn_state_psns_failover, failover_teardown),
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
