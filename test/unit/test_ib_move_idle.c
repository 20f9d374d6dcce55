/*
 * nccl-net-rail unit tests: what verbs failover costs when nothing fails,
 * and the event-driven move thread (src/ib/ib_move_thread.c,
 * docs/FAILOVER.md) on the fake provider. Idle comms cost the thread no
 * wake-up; with NCCL calling neither side, a PORT_ERR, a DEVICE_FATAL, a
 * QP_FATAL, a move back after the hold-down, and a peer's MOVE arriving
 * with no event on this side are still carried through by the thread; a
 * move's RTR runs on it (the fake's rtr_ms: RoCE's address resolution),
 * without the comm's guard, so NCCL's isend, iflush and close return
 * promptly meanwhile.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

uint64_t rail_ib_move_thread_loops(void);	/* src/ib/ib_move_thread.c, for tests */

static const char roce_two[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n"
			       "device mlx5_1\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::2 type=v1\n"
			       "gid 1 ::ffff:10.2.0.1 type=v2\n";

/* The same, with an RTR toward another QP taking 1.5 s (RoCE resolving the peer's address). */
static const char roce_two_slow[] = "device mlx5_0 rtr_ms=1500\n"
				    "port 1 link=eth speed=ndr width=4x\n"
				    "gid 0 fe80::1 type=v1\n"
				    "gid 1 ::ffff:10.1.0.1 type=v2\n"
				    "device mlx5_1 rtr_ms=1500\n"
				    "port 1 link=eth speed=ndr width=4x\n"
				    "gid 0 fe80::2 type=v1\n"
				    "gid 1 ::ffff:10.2.0.1 type=v2\n";

#define BUF (256 * 1024)
#define PROMPT_NS (500ull * 1000000ull)	/* a call that does not wait for an RTR (1.5 s) */
static unsigned char sbuf[BUF], rbuf[BUF];
static void *smh, *rmh;

static void fill(unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

/* Post the receive of message `seed` (n bytes); its request. */
static void *post_recv(struct fvh *F)
{
	void *rreq = NULL, *data[1] = { rbuf }, *mhs[1] = { rmh };
	size_t sizes[1] = { BUF };
	int tags[1] = { 7 };

	while (!rreq)
		assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), ncclSuccess);
	return rreq;
}

/* Test sreq (NULL: done already) and rreq until both are done; check the n bytes of `seed`. */
static void finish(void *sreq, void *rreq, size_t n, int seed)
{
	uint64_t end = rail_now_ns() + 30000000000ull;
	int sdone = !sreq, rdone = 0, got[1] = { -1 };
	unsigned char want[BUF];

	while ((!sdone || !rdone) && rail_now_ns() < end) {
		if (!sdone)
			assert_int_equal(rail_net_test(sreq, &sdone, NULL), ncclSuccess);
		if (!rdone)
			assert_int_equal(rail_net_test(rreq, &rdone, got), ncclSuccess);
	}
	if (!sdone || !rdone) {
		fvh_log_dump();
		fail_msg("message %d: send %s, receive %s after 30 s", seed, sdone ? "done" : "not done",
			 rdone ? "done" : "not done");
	}
	fill(want, n, seed);
	assert_int_equal(got[0], (int)n);
	assert_memory_equal(rbuf, want, n);
}

/* One message of n bytes through the pair, NCCL calling both sides; every byte checked. */
static void one_message(struct fvh *F, size_t n, int seed)
{
	void *rreq = post_recv(F), *sreq = NULL;

	fill(sbuf, n, seed);
	while (!sreq)
		assert_int_equal(rail_net_isend(F->sc, sbuf, n, 7, smh, &sreq), ncclSuccess);
	finish(sreq, rreq, n, seed);
}

/* The fake on conf, the receiver on mlx5_1, the sender on mlx5_0; an eager and a CTS message. */
static struct fvh *start_pair(const char *conf)
{
	struct fvh *F = fvh_start(conf);

	fvh_connect(F, 1, 0, -1);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	one_message(F, 8, 1);
	one_message(F, 100000, 2);
	return F;
}

static void stop_pair(struct fvh *F)
{
	if (F->sc)
		assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	if (F->rc)
		assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_stop(F);
}

/* Both sides' move lines (level) after mark, with NCCL calling neither; 10 s at most. */
static void wait_moved(int mark, int level, const char *send_line, const char *recv_line)
{
	if (!fvh_wait_log_from(mark, level, "(send comm) moved", send_line, 10000) ||
	    !fvh_wait_log_from(mark, level, "(receive comm) moved", recv_line, 10000)) {
		fvh_log_dump();
		fail_msg("no move of both idle comms (\"%s\", \"%s\"): the move thread did not "
			 "drive them", send_line, recv_line);
	}
}

/*
 * Idle comms cost the move thread no wake-up: with a pair connected and
 * used, then left alone for 2 s, the thread's loop does not turn. A
 * PORT_ACTIVE (no move) then wakes it: the count counts.
 */
static void test_idle_no_wakeups(void **state)
{
	struct fvh *F;
	uint64_t l0, l1;

	(void)state;
	F = start_pair(roce_two);
	usleep(300000);
	l0 = rail_ib_move_thread_loops();
	usleep(2000000);
	l1 = rail_ib_move_thread_loops();
	if (l1 != l0)
		fail_msg("the move thread woke %llu times in 2 s with both comms idle",
			 (unsigned long long)(l1 - l0));
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_ACTIVE), 1);
	for (int i = 0; i < 5000 && rail_ib_move_thread_loops() == l1; i++)
		usleep(1000);
	assert_true(rail_ib_move_thread_loops() > l1);
	one_message(F, 8, 3);
	stop_pair(F);
}

/* PORT_ERR on the sender's port: the thread moves the sender (async event) and the receiver (its MOVE). */
static void test_idle_port_err(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = start_pair(roce_two);
	mark = fvh_log_mark();
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	wait_moved(mark, NCCL_LOG_WARN,
		   "from mlx5_0:1 to mlx5_1:1 (the nearest to mlx5_0:1 by PCI path): PORT_ERR",
		   "from mlx5_1:1 to mlx5_1:1: joins");
	one_message(F, 8, 3);
	one_message(F, 100000, 4);
	stop_pair(F);
}

static void test_idle_device_fatal(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = start_pair(roce_two);
	mark = fvh_log_mark();
	assert_true(F->event("mlx5_0", 1, IBV_EVENT_DEVICE_FATAL) >= 1);
	wait_moved(mark, NCCL_LOG_WARN,
		   "from mlx5_0:1 to mlx5_1:1 (the nearest to mlx5_0:1 by PCI path): DEVICE_FATAL",
		   "DEVICE_FATAL");
	one_message(F, 8, 3);
	one_message(F, 100000, 4);
	stop_pair(F);
}

static void test_idle_qp_fatal(void **state)
{
	struct fvh *F;
	int mark;

	(void)state;
	F = start_pair(roce_two);
	mark = fvh_log_mark();
	assert_non_null(F->qp_fatal);
	assert_true(F->qp_fatal("mlx5_0") > 0);
	wait_moved(mark, NCCL_LOG_WARN, "from mlx5_0:1 to mlx5_0:1: QP_FATAL on mlx5_0:1 qp 0x",
		   "QP_FATAL");
	one_message(F, 8, 3);
	one_message(F, 100000, 4);
	stop_pair(F);
}

/*
 * Move-back with both comms idle: mlx5_0 comes back, and once it has been
 * up for the hold-down (1 s) the thread's timer moves the sender home,
 * the receiver along; not before.
 */
static void test_idle_move_back(void **state)
{
	struct fvh *F;
	int mark;
	uint64_t up;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	F = start_pair(roce_two);
	mark = fvh_log_mark();
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	wait_moved(mark, NCCL_LOG_WARN, "from mlx5_0:1 to mlx5_1:1", "to mlx5_1:1");
	mark = fvh_log_mark();
	up = rail_now_ns();
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_ACTIVE), 1);
	wait_moved(mark, NCCL_LOG_INFO, "back from mlx5_1:1 to mlx5_0:1: mlx5_0:1 ACTIVE again",
		   "back from mlx5_1:1 to mlx5_1:1");
	if (rail_now_ns() - up < 1000000000ull)
		fail_msg("moved back %.3f s after PORT_ACTIVE, before the 1 s hold-down",
			 (double)(rail_now_ns() - up) / 1e9);
	one_message(F, 100000, 3);
	stop_pair(F);
}

/*
 * A peer's MOVE on an idle comm, with no event on its side: the receiver
 * posts a receive and is not called again; the sender's device then stops
 * completing (held writes, no port event) while NCCL tests only the send;
 * the stall watchdog (1 s) moves the sender, and the receiver, whose
 * devices raised nothing, must join through its socket turning readable,
 * or the send never completes.
 */
static void test_idle_peer_move(void **state)
{
	struct fvh *F;
	void *sreq = NULL, *rreq;
	int mark, held = 1, done = 0;
	uint64_t end;

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	F = start_pair(roce_two);
	rreq = post_recv(F);	/* its clear-to-send goes now; then the receiver is left alone */
	mark = fvh_log_mark();
	assert_true(F->hold("mlx5_0", 1) >= 0);
	fill(sbuf, 100000, 5);
	end = rail_now_ns() + 20000000000ull;
	while (!sreq && rail_now_ns() < end)
		assert_int_equal(rail_net_isend(F->sc, sbuf, 100000, 7, smh, &sreq), ncclSuccess);
	while (sreq && !done && rail_now_ns() < end) {
		assert_int_equal(rail_net_test(sreq, &done, NULL), ncclSuccess);
		if (held && fvh_log_count_from(mark, NCCL_LOG_WARN, "completions owed", NULL)) {
			assert_true(F->hold("mlx5_0", 0) >= 0);
			held = 0;
		}
	}
	if (!done) {
		fvh_log_dump();
		fail_msg("the send did not complete: the idle receiver never joined the move");
	}
	wait_moved(mark, NCCL_LOG_WARN, "from mlx5_0:1 to mlx5_0:1: stall", "stall");
	finish(NULL, rreq, 100000, 5);
	one_message(F, 8, 6);
	stop_pair(F);
}

/*
 * A move's RTR is not done on NCCL's thread: with each RTR taking 1.5 s,
 * the sender's port goes down while NCCL keeps calling isend on the sender
 * and iflush (host memory: nothing to flush) on the receiver; their calls
 * drive both moves (the thread leaves a comm NCCL calls to those calls),
 * which end while the calls go on; no call may take 0.5 s. The message
 * then goes.
 */
static void test_rtr_off_proxy(void **state)
{
	struct fvh *F;
	void *sreq = NULL, *rreq, *data[1] = { rbuf }, *mhs[1];
	int sizes[1] = { 8 }, mark;
	uint64_t end, worst_send = 0, worst_flush = 0;

	(void)state;
	F = start_pair(roce_two_slow);
	mhs[0] = rmh;
	mark = fvh_log_mark();
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	fill(sbuf, 200000, 7);
	end = rail_now_ns() + 20000000000ull;
	while (fvh_log_count_from(mark, NCCL_LOG_WARN, "(send comm) moved", NULL) == 0 ||
	       fvh_log_count_from(mark, NCCL_LOG_WARN, "(receive comm) moved", NULL) == 0) {
		if (rail_now_ns() >= end) {
			fvh_log_dump();
			fail_msg("both comms not moved after 20 s of NCCL's calls (4 RTRs of 1.5 s "
				 "each): a call that does not drive the move keeps the move thread "
				 "from driving it");
		}
		uint64_t t = rail_now_ns();
		void *freq = NULL;

		if (!sreq)	/* no receive posted: its CTS cannot come, NCCL retries */
			assert_int_equal(rail_net_isend(F->sc, sbuf, 200000, 7, smh, &sreq),
					 ncclSuccess);
		worst_send = RAIL_MAX(worst_send, rail_now_ns() - t);
		t = rail_now_ns();
		assert_int_equal(rail_net_iflush(F->rc, 1, data, sizes, mhs, &freq), ncclSuccess);
		worst_flush = RAIL_MAX(worst_flush, rail_now_ns() - t);
		assert_null(freq);	/* host memory: nothing to flush */
	}
	wait_moved(mark, NCCL_LOG_WARN, "to mlx5_1:1", "to mlx5_1:1");
	if (worst_send >= PROMPT_NS || worst_flush >= PROMPT_NS)
		fail_msg("during the move an isend took %.3f s and an iflush %.3f s: the RTR (1.5 s) "
			 "ran on NCCL's thread or under the comm's guard", (double)worst_send / 1e9,
			 (double)worst_flush / 1e9);
	rreq = post_recv(F);
	while (!sreq)
		assert_int_equal(rail_net_isend(F->sc, sbuf, 200000, 7, smh, &sreq), ncclSuccess);
	finish(sreq, rreq, 200000, 7);
	stop_pair(F);
}

/*
 * NCCL's calls while the thread runs a move's RTR (1.5 s) on the idle
 * pair: an iflush on the comm whose RTR runs, an isend on the other, then
 * both closes return promptly (the comm whose RTR runs is freed by the
 * thread when it ends), and finalize then succeeds with nothing left open.
 */
static void test_calls_during_rtr(void **state)
{
	struct fvh *F;
	void *sreq = NULL, *freq = (void *)1, *data[1] = { rbuf }, *mhs[1] = { NULL };
	int sizes[1] = { 8 }, calls, mark;
	uint64_t t, dt[4];

	(void)state;
	F = start_pair(roce_two_slow);
	calls = fvh_calls_mark(F);
	mark = fvh_log_mark();
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	for (int i = 0; i < 10000 && !fvh_calls(F, calls, "rtr_wait", NULL, NULL, NULL); i++)
		usleep(1000);
	if (!fvh_calls(F, calls, "rtr_wait", NULL, NULL, NULL)) {
		fvh_log_dump();
		fail_msg("no RTR of a moving comm within 10 s");
	}
	/* the receiver's RTR runs (it joined and connects first); the sender waits for its turn */
	t = rail_now_ns();
	assert_int_equal(rail_net_iflush(F->rc, 1, data, sizes, mhs, &freq), ncclSuccess);
	dt[0] = rail_now_ns() - t;
	assert_null(freq);
	t = rail_now_ns();
	assert_int_equal(rail_net_isend(F->sc, sbuf, 200000, 7, smh, &sreq), ncclSuccess);
	dt[1] = rail_now_ns() - t;
	assert_null(sreq);	/* moving */
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	t = rail_now_ns();
	assert_int_equal(rail_net_close_recv(F->rc), ncclSuccess);
	dt[2] = rail_now_ns() - t;
	F->rc = NULL;
	t = rail_now_ns();
	assert_int_equal(rail_net_close_send(F->sc), ncclSuccess);
	dt[3] = rail_now_ns() - t;
	F->sc = NULL;
	if (dt[0] >= PROMPT_NS || dt[1] >= PROMPT_NS || dt[2] >= PROMPT_NS || dt[3] >= PROMPT_NS)
		fail_msg("during the move's RTR (1.5 s): iflush took %.3f s, isend %.3f s, closing the "
			 "receive comm %.3f s, the send comm %.3f s", (double)dt[0] / 1e9,
			 (double)dt[1] / 1e9, (double)dt[2] / 1e9, (double)dt[3] / 1e9);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_WARN, "still open", NULL), 0);
	fvh_stop(F);	/* finalize: fails if a comm still counts as open */
}

static int env_teardown(void **state)
{
	unsetenv("NCCL_RAIL_FAILOVER_HOLDDOWN");
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	return fvh_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_idle_no_wakeups, env_teardown),
		cmocka_unit_test_teardown(test_idle_port_err, env_teardown),
		cmocka_unit_test_teardown(test_idle_device_fatal, env_teardown),
		cmocka_unit_test_teardown(test_idle_qp_fatal, env_teardown),
		cmocka_unit_test_teardown(test_idle_move_back, env_teardown),
		cmocka_unit_test_teardown(test_idle_peer_move, env_teardown),
		cmocka_unit_test_teardown(test_rtr_off_proxy, env_teardown),
		cmocka_unit_test_teardown(test_calls_during_rtr, env_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_move_idle: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_move_idle: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
