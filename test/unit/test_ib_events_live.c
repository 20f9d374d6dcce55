/*
 * nccl-net-rail: port and address changes on real verbs while the plugin
 * runs (issue 10 defect 6), driven by test/rxe/tests.d/14-ib-events.sh in
 * the Soft-RoCE guest, which passes the shell commands that change the
 * guest's network:
 *
 *   RAIL_TEST_EVENTS_READDRESS  re-address rxe0's netdev; returns once the
 *                               new GID is in sysfs
 *   RAIL_TEST_EVENTS_NEW_GID    that GID as text (::ffff:a.b.c.d)
 *   RAIL_TEST_EVENTS_LINKDOWN   take rxe0's netdev down
 *   RAIL_TEST_EVENTS_LINKUP     bring it back (routes, GID, port ACTIVE)
 *
 * One process, the sender on rxe0 (whose address changes), the receiver on
 * rxe1: a connection made before the change; the async thread's GID_CHANGE
 * line old -> new; a connection made after it carries data (the old GID is
 * gone, so the frozen one could not); what the old connection does (logged,
 * not asserted); link down: PORT_ERR, a new connect fails with the named
 * error, the running comm fails within 10 s rather than hang; link up:
 * PORT_ACTIVE and a new connection carries data again.
 *
 * Skipped (saying why) without those variables: make test-unit on a host.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

#define BIG (1 << 20)
#define NS 1000000000ull

struct comms {
	void *lc, *sc, *rc;
	void *smh, *rmh;
};

static void *ctx;
static int dev_send = -1, dev_recv = -1;
static uint8_t *sbuf, *rbuf;

static int find_dev(const char *name)
{
	int n = 0;

	assert_int_equal(rail_net_devices(&n), ncclSuccess);
	for (int i = 0; i < n; i++) {
		struct rail_props p;

		memset(&p, 0, sizeof(p));
		if (rail_net_get_properties(i, &p) == ncclSuccess && p.name && !strcmp(p.name, name))
			return i;
	}
	fail_msg("no device %s among %d", name, n);
	return -1;
}

/* Listen on dev_recv, connect from dev_send, within 60 s: 0, or the failed call's result. */
static int open_comms(struct comms *C)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 60 * NS;
	ncclResult_t cr = ncclSuccess, ar = ncclSuccess;

	memset(C, 0, sizeof(*C));
	if (rail_net_listen(ctx, dev_recv, handle, &C->lc) != ncclSuccess)
		return -1;
	while ((!C->sc || !C->rc) && rail_now_ns() < deadline) {
		if (!C->sc && cr == ncclSuccess)
			cr = rail_net_connect(ctx, dev_send, -1, handle, &C->sc);
		if (cr != ncclSuccess && !C->rc)
			break;	/* nothing will arrive */
		if (!C->rc && ar == ncclSuccess)
			ar = rail_net_accept(C->lc, &C->rc);
		if (ar != ncclSuccess)
			break;
	}
	if (!C->sc || !C->rc)
		return cr != ncclSuccess ? (int)cr : ar != ncclSuccess ? (int)ar : -2;
	if (rail_net_reg_mr(C->sc, sbuf, BIG, NCCL_PTR_HOST, &C->smh) != ncclSuccess ||
	    rail_net_reg_mr(C->rc, rbuf, BIG, NCCL_PTR_HOST, &C->rmh) != ncclSuccess)
		return -3;
	return 0;
}

static void close_comms(struct comms *C)
{
	if (C->smh)
		rail_net_dereg_mr(C->sc, C->smh);
	if (C->rmh)
		rail_net_dereg_mr(C->rc, C->rmh);
	if (C->sc)
		assert_int_equal(rail_net_close_send(C->sc), ncclSuccess);
	if (C->rc)
		assert_int_equal(rail_net_close_recv(C->rc), ncclSuccess);
	if (C->lc)
		assert_int_equal(rail_net_close_listen(C->lc), ncclSuccess);
	memset(C, 0, sizeof(*C));
}

/*
 * One message of size bytes within limit_s: 0 delivered intact, 1 still
 * pending at the limit (a hang), or -1 a call failed (the comm's error).
 */
static int transfer(struct comms *C, size_t size, int tag, int limit_s)
{
	uint64_t deadline = rail_now_ns() + (uint64_t)limit_s * NS;
	void *d[1] = { rbuf }, *m[1] = { C->rmh }, *sr = NULL, *rr = NULL;
	size_t sz[1] = { BIG };
	int t[1] = { tag }, sdone = 0, rdone = 0, got[1] = { -1 };

	for (size_t i = 0; i < size; i++)
		sbuf[i] = (uint8_t)(tag * 13 + i * 7);
	memset(rbuf, 0, size);
	while ((!sr || !rr) && rail_now_ns() < deadline) {
		if (!rr && rail_net_irecv(C->rc, 1, d, sz, t, m, &rr) != ncclSuccess)
			return -1;
		if (!sr && rail_net_isend(C->sc, sbuf, size, tag, C->smh, &sr) != ncclSuccess)
			return -1;
	}
	while ((!sdone || !rdone) && rail_now_ns() < deadline) {
		if (!sdone && rail_net_test(sr, &sdone, NULL) != ncclSuccess)
			return -1;
		if (!rdone && rail_net_test(rr, &rdone, got) != ncclSuccess)
			return -1;
	}
	if (!sdone || !rdone)
		return 1;
	if (got[0] != (int)size || memcmp(sbuf, rbuf, size))
		fail_msg("message of %zu bytes arrived wrong (%d bytes)", size, got[0]);
	return 0;
}

static void run_cmd(const char *var)
{
	const char *cmd = getenv(var);
	uint64_t t0 = rail_now_ns();
	int rc = system(cmd);

	print_message("%s: rc %d after %.1f s\n", var, rc, (double)(rail_now_ns() - t0) / 1e9);
	if (rc != 0)
		fail_msg("%s (%s) failed: %d", var, cmd, rc);
}

static void wait_line(int from, int level, const char *a, const char *b, const char *what)
{
	if (!fvh_wait_log_from(from, level, a, b, 15000)) {
		fvh_log_dump();
		fail_msg("no log line with '%s' and '%s' within 15 s (%s)", a, b ? b : "", what);
	}
}

static void test_readdress_and_link_down(void **state)
{
	const char *new_gid = getenv("RAIL_TEST_EVENTS_NEW_GID");
	struct comms A, B, C;
	uint64_t t0;
	int mark, down = 0, r;

	(void)state;
	if (!getenv("RAIL_TEST_EVENTS_READDRESS") || !new_gid ||
	    !getenv("RAIL_TEST_EVENTS_LINKDOWN") || !getenv("RAIL_TEST_EVENTS_LINKUP")) {
		print_message("skipped: run by test/rxe/tests.d/14-ib-events.sh in the rxe guest, "
			      "which sets RAIL_TEST_EVENTS_*\n");
		skip();
	}
	sbuf = malloc(BIG);
	rbuf = malloc(BIG);
	assert_true(sbuf && rbuf);
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);	/* the OOB must not sit on the re-addressed netdev */
	rail_params_reload();
	rail_log_set_logger((rail_logger_fn)fvh_sink);
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, FVH_ABI), ncclSuccess);
	dev_send = find_dev("rxe0");
	dev_recv = find_dev("rxe1");

	/* 1. A connection before the change. */
	assert_int_equal(open_comms(&A), 0);
	assert_int_equal(transfer(&A, BIG, 1, 30), 0);
	assert_int_equal(transfer(&A, 100, 2, 30), 0);

	/* 2. Re-address rxe0's netdev; 3. a connection after it: the new GID, data flows. */
	mark = fvh_log_mark();
	run_cmd("RAIL_TEST_EVENTS_READDRESS");
	r = open_comms(&B);
	if (r)
		fvh_log_dump();
	assert_int_equal(r, 0);
	r = transfer(&B, BIG, 3, 30);
	print_message("a connection made after the change: 1 MiB %s\n",
		      r == 0 ? "delivered" : r > 0 ? "still pending at 30 s" : "failed");
	assert_int_equal(r, 0);
	assert_int_equal(transfer(&B, 100, 4, 30), 0);
	print_message("a connection made after the change carried 1 MiB + 100 B\n");
	/* the kernel's GID_CHANGE: old -> new */
	wait_line(mark, NCCL_LOG_INFO, "rxe0:1: GID table changed", new_gid, "GID_CHANGE, old -> new");

	/* 4. The connection made before: it keeps the old GID (reported, not asserted). */
	t0 = rail_now_ns();
	r = transfer(&A, 4096, 5, 10);
	print_message("the connection made before the change: %s after %.1f s\n",
		      r == 0 ? "still carries data" : r > 0 ? "pending (no error) at 10 s" :
		      "failed", (double)(rail_now_ns() - t0) / 1e9);
	close_comms(&A);

	/*
	 * 5. Link down (the veth peer loses carrier too, so rxe1 goes down as
	 * well): PORT_ERR; a new connect from rxe0 is refused by name (its
	 * listener was made before); B fails within 10 s, not hang.
	 */
	{
		uint8_t handle[RAIL_HANDLE_SIZE];
		ncclResult_t cr;

		memset(&C, 0, sizeof(C));
		assert_int_equal(rail_net_listen(ctx, dev_recv, handle, &C.lc), ncclSuccess);
		mark = down = fvh_log_mark();
		run_cmd("RAIL_TEST_EVENTS_LINKDOWN");
		wait_line(mark, NCCL_LOG_WARN, "rxe0:1: async event PORT_ERR", NULL, "PORT_ERR");
		mark = fvh_log_mark();
		t0 = rail_now_ns();
		cr = rail_net_connect(ctx, dev_send, -1, handle, &C.sc);
		print_message("connect after link down: result %d in %.3f s\n", cr,
			      (double)(rail_now_ns() - t0) / 1e9);
		assert_int_not_equal(cr, ncclSuccess);
		assert_null(C.sc);
		wait_line(mark, NCCL_LOG_WARN, "connect", "rxe0:1 refused: the port is down",
			  "named error");
		close_comms(&C);
	}
	mark = fvh_log_mark();
	t0 = rail_now_ns();
	r = transfer(&B, 4096, 6, 10);
	print_message("the running comm after link down: %s after %.3f s\n",
		      r == 0 ? "delivered" : r > 0 ? "HANG (still pending at 10 s)" : "failed",
		      (double)(rail_now_ns() - t0) / 1e9);
	assert_int_equal(r, -1);
	/*
	 * Both ports are down (one veth pair). With failover there is nowhere to
	 * move, named; the move thread may have found that already, idle as B was.
	 */
	if (rail_param_int(RAIL_P_FAILOVER))
		wait_line(down, NCCL_LOG_WARN, "no other usable port", "rxe", "named error of the comm");
	else
		wait_line(mark, NCCL_LOG_WARN, "went down (async event PORT_ERR)", NULL,
			  "named error of the comm");
	close_comms(&B);

	/* 6. Link up: PORT_ACTIVE re-enables new connections. */
	mark = fvh_log_mark();
	run_cmd("RAIL_TEST_EVENTS_LINKUP");
	wait_line(mark, NCCL_LOG_INFO, "rxe0:1: port ACTIVE again", NULL, "PORT_ACTIVE");
	r = open_comms(&C);
	if (r)
		fvh_log_dump();
	assert_int_equal(r, 0);
	assert_int_equal(transfer(&C, BIG, 7, 30), 0);
	print_message("after link up: a new connection carried 1 MiB\n");
	close_comms(&C);

	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	rail_log_set_logger(NULL);
	free(sbuf);
	free(rbuf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_readdress_and_link_down),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
