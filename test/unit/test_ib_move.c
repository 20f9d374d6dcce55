/*
 * nccl-net-rail unit tests: failover of verbs comms (src/ib/ib_move.c,
 * docs/FAILOVER.md) on the fake provider. A transfer loop of mixed sizes
 * (eager, clear-to-send, larger than a send queue's inline size) with every
 * byte checked; a port goes down in the middle. With NCCL_RAIL_FAILOVER=1
 * (the default) no request may fail, every message must arrive intact and
 * both sides must log the move naming both devices. The same with
 * NCCL_RAIL_FAILOVER=0 fails by name (test_ib_events.c); with no other port
 * left, the comm fails naming that. Fused NICs (two ports of one card per
 * side, fused as NCCL's makeVDevice does): a member's port goes down and
 * that member moves to the surviving port, the other members are rebuilt
 * where they are, on both sides.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

static const char roce_two[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n"
			       "device mlx5_1\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::2 type=v1\n"
			       "gid 1 ::ffff:10.2.0.1 type=v2\n";

static const char roce_one[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

/*
 * Two "nodes" on two rails, in one process: node S has mlx5_0 (rail 1,
 * 10.1.0.1) and mlx5_1 (rail 2, 10.2.0.1) on one card, node R mlx5_2 (rail
 * 1, 10.1.0.2) and mlx5_3 (rail 2, 10.2.0.2) on another. The fake joins any
 * two QPs: what is asserted is where each side's comm goes.
 */
static const char roce_rails[] = "device mlx5_0 pci=0000:1a:00.0\n"
				 "port 1 link=eth speed=ndr width=4x\n"
				 "gid 0 fe80::1 type=v1\n"
				 "gid 1 ::ffff:10.1.0.1 type=v2\n"
				 "device mlx5_1 pci=0000:1a:00.1\n"
				 "port 1 link=eth speed=ndr width=4x\n"
				 "gid 0 fe80::2 type=v1\n"
				 "gid 1 ::ffff:10.2.0.1 type=v2\n"
				 "device mlx5_2 pci=0000:3b:00.0\n"
				 "port 1 link=eth speed=ndr width=4x\n"
				 "gid 0 fe80::3 type=v1\n"
				 "gid 1 ::ffff:10.1.0.2 type=v2\n"
				 "device mlx5_3 pci=0000:3b:00.1\n"
				 "port 1 link=eth speed=ndr width=4x\n"
				 "gid 0 fe80::4 type=v1\n"
				 "gid 1 ::ffff:10.2.0.2 type=v2\n";

/* Two dual-port cards: each side fuses the two ports of one card. */
static const char roce_dual[] = "device mlx5_0 pci=0000:1b:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::1 type=v1\n"
				"gid 1 ::ffff:10.1.0.1 type=v2\n"
				"port 2 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::3 type=v1\n"
				"gid 1 ::ffff:10.3.0.1 type=v2\n"
				"device mlx5_1 pci=0000:3d:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::2 type=v1\n"
				"gid 1 ::ffff:10.2.0.1 type=v2\n"
				"port 2 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::4 type=v1\n"
				"gid 1 ::ffff:10.4.0.1 type=v2\n";

/* Four single-port cards: each side fuses two cards (different HCAs: keys differ per member). */
static const char roce_four[] = "device mlx5_0 pci=0000:1b:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::1 type=v1\n"
				"gid 1 ::ffff:10.1.0.1 type=v2\n"
				"device mlx5_1 pci=0000:1c:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::2 type=v1\n"
				"gid 1 ::ffff:10.2.0.1 type=v2\n"
				"device mlx5_2 pci=0000:3d:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::3 type=v1\n"
				"gid 1 ::ffff:10.3.0.1 type=v2\n"
				"device mlx5_3 pci=0000:3e:00.0\n"
				"port 1 link=eth speed=ndr width=4x\n"
				"gid 0 fe80::4 type=v1\n"
				"gid 1 ::ffff:10.4.0.1 type=v2\n";

/* Two "nodes" of two ports each (two functions of one card), all on one network. */
static const char one_net[] = "device mlx5_0 pci=0000:1a:00.0\n"
			      "port 1 link=eth speed=ndr width=4x\n"
			      "gid 1 ::ffff:10.1.0.1 type=v2\n"
			      "device mlx5_1 pci=0000:1a:00.1\n"
			      "port 1 link=eth speed=ndr width=4x\n"
			      "gid 1 ::ffff:10.1.0.2 type=v2\n"
			      "device mlx5_2 pci=0000:3b:00.0\n"
			      "port 1 link=eth speed=ndr width=4x\n"
			      "gid 1 ::ffff:10.1.0.3 type=v2\n"
			      "device mlx5_3 pci=0000:3b:00.1\n"
			      "port 1 link=eth speed=ndr width=4x\n"
			      "gid 1 ::ffff:10.1.0.4 type=v2\n";

#define BUF (256 * 1024)
#define WIN 4		/* messages in flight per side, as NCCL's pipeline keeps them */
static unsigned char sbuf[WIN][BUF], rbuf[WIN][BUF];

static void port_state_at(struct fvh *F, const char *dev, int port, int state, int level,
			  const char *what)
{
	int mark = fvh_log_mark();
	char name[64];

	snprintf(name, sizeof(name), "%s:%d", dev, port);
	assert_int_equal(F->port_state(dev, port, state), 1);
	if (!fvh_wait_log_from(mark, level, name, what, 5000)) {
		fvh_log_dump();
		fail_msg("the plugin did not report %s %s", name, what);
	}
}

static void port_state(struct fvh *F, const char *dev, int state, int level, const char *what)
{
	port_state_at(F, dev, 1, state, level, what);
}

static void fill(unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

static size_t msg_size(int i)
{
	static const size_t sizes[] = { 8, 3000, 65536, 100, 200000, 8, 20000, 4096, 4097 };

	return sizes[i % (int)(sizeof(sizes) / sizeof(sizes[0]))];
}

enum fault { FAULT_PORT, FAULT_DEVICE, FAULT_QP };

struct loop {
	struct fvh *F;
	void *smh, *rmh;
	int fault_at;		/* message at whose posting the port goes down (-1: none) */
	const char *fault_dev;
	enum fault fault;	/* what happens to fault_dev then */
	int fault_port;		/* its port (0: 1) */
	int hold_at;		/* from this message on fault_dev holds its sends (0: no) */
	int held;		/* 1: fault_dev holds; 2: released (release_on) */
	const char *release_on;	/* a WARN after which the hold ends (NULL: never) */
	int mark;		/* ... looked for from this log mark */
	int failed;		/* a call failed: its ncclResult_t */
	void *sreq[WIN], *rreq[WIN];
	int sent, recvd, sdone, rdone;	/* messages posted / completed per side */
};

/* The receive of message i completed with got bytes: check every byte. */
static void check_recv(int i, int got)
{
	unsigned char want[BUF];
	size_t n = msg_size(i);

	if (got != (int)n)
		fail_msg("message %d: %d bytes reported, %zu sent", i, got, n);
	fill(want, n, i);
	if (memcmp(rbuf[i % WIN], want, n) != 0)
		fail_msg("message %d (%zu bytes): the bytes differ", i, n);
}

/*
 * The fault: the port goes down; or the device fails (DEVICE_FATAL: from
 * then on it completes and places nothing); or one of its QPs fails on its
 * own (QP_FATAL: the QP goes to error, its WRs flushed).
 */
static void inject(struct loop *L)
{
	int mark = fvh_log_mark(), ok = 1;

	switch (L->fault) {
	case FAULT_PORT:
		port_state_at(L->F, L->fault_dev, L->fault_port ? L->fault_port : 1, IBV_PORT_DOWN,
			      NCCL_LOG_WARN, "went down");
		/* what the other ports hold goes now; the failed port's stays lost */
		if (L->hold_at)
			assert_true(L->F->hold(L->fault_dev, 0) > 0);
		return;
	case FAULT_DEVICE:
		assert_true(L->F->event(L->fault_dev, 1, IBV_EVENT_DEVICE_FATAL) >= 1);
		ok = fvh_wait_log_from(mark, NCCL_LOG_WARN, L->fault_dev, "the device failed", 5000);
		break;
	case FAULT_QP:
		assert_non_null(L->F->qp_fatal);
		assert_true(L->F->qp_fatal(L->fault_dev) > 0);
		ok = fvh_wait_log_from(mark, NCCL_LOG_WARN, L->fault_dev, "on qp", 5000);
		break;
	}
	if (!ok) {
		fvh_log_dump();
		fail_msg("the plugin did not report the fault on %s", L->fault_dev);
	}
}

/* One turn of a proxy thread: post what the windows allow, test what is in flight. */
static int turn(struct loop *L, int count)
{
	ncclResult_t r = ncclSuccess;

	if (L->recvd < count && L->recvd - L->rdone < WIN && !L->rreq[L->recvd % WIN]) {
		int k = L->recvd % WIN, tags[1] = { 7 };
		void *data[1] = { rbuf[k] }, *mhs[1] = { L->rmh };
		size_t sizes[1] = { BUF };

		memset(rbuf[k], 0xee, BUF);
		r = rail_net_irecv(L->F->rc, 1, data, sizes, tags, mhs, &L->rreq[k]);
		L->recvd += L->rreq[k] != NULL;
	}
	if (!r && L->hold_at && L->sent == L->hold_at && L->fault_dev && !L->held) {
		assert_true(L->F->hold(L->fault_dev, 1) >= 0);
		L->held = 1;
	}
	if (!r && L->held == 1 && L->release_on &&
	    fvh_log_count_from(L->mark, NCCL_LOG_WARN, L->release_on, NULL)) {
		assert_true(L->F->hold(L->fault_dev, 0) >= 0);
		L->held = 2;
	}
	if (!r && L->sent == L->fault_at && L->fault_dev) {
		inject(L);
		L->fault_dev = NULL;
	}
	if (!r && L->sent < count && L->sent - L->sdone < WIN && !L->sreq[L->sent % WIN]) {
		int k = L->sent % WIN;

		fill(sbuf[k], msg_size(L->sent), L->sent);
		r = rail_net_isend(L->F->sc, sbuf[k], msg_size(L->sent), 7, L->smh, &L->sreq[k]);
		L->sent += L->sreq[k] != NULL;
	}
	if (!r && L->sdone < L->sent) {
		int k = L->sdone % WIN, done = 0;

		r = rail_net_test(L->sreq[k], &done, NULL);
		if (!r && done) {
			L->sreq[k] = NULL;
			L->sdone++;
		}
	}
	if (!r && L->rdone < L->recvd) {
		int k = L->rdone % WIN, done = 0, got[1] = { -1 };

		r = rail_net_test(L->rreq[k], &done, got);
		if (!r && done) {
			check_recv(L->rdone, got[0]);
			L->rreq[k] = NULL;
			L->rdone++;
		}
	}
	return L->failed = r;
}

/* Messages up to count, both sides' requests all done (call again to go on). */
static int run_to(struct loop *L, int count)
{
	uint64_t deadline = rail_now_ns() + 60000000000ull;

	if (!L->smh) {
		assert_int_equal(rail_net_reg_mr(L->F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST,
						 &L->smh), 0);
		assert_int_equal(rail_net_reg_mr(L->F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST,
						 &L->rmh), 0);
	}
	while (L->sdone < count || L->rdone < count) {
		if (turn(L, count))
			return L->failed;
		if (rail_now_ns() > deadline) {
			if (L->held == 1 && L->release_on) {
				fvh_log_dump();
				fail_msg("no WARN \"%s\" in 60 s: the hold on %s was never "
					 "released", L->release_on, L->fault_dev);
			}
			fail_msg("%d of %d messages received, %d sends done after 60 s", L->rdone,
				 count, L->sdone);
		}
	}
	return 0;
}

static int run_loop(struct loop *L, int count)
{
	return run_to(L, count);
}

static void loop_end(struct loop *L)
{
	assert_int_equal(rail_net_dereg_mr(L->F->sc, L->smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L->F->rc, L->rmh), ncclSuccess);
	fvh_stop(L->F);
}

static void assert_moved(int from, const char *kind, const char *devs)
{
	if (!fvh_log_count_from(from, NCCL_LOG_WARN, kind, devs)) {
		fvh_log_dump();
		fail_msg("no WARN \"%s ... %s\"", kind, devs);
	}
}

/*
 * L runs to count messages and no call may fail (run_case: first the fake
 * on conf, the receiver on device rdev and the sender on sdev). Returns the
 * log mark from before the run.
 */
static int run_connected(struct loop *L, int count)
{
	int mark = fvh_log_mark();

	if (run_loop(L, count)) {
		fvh_log_dump();
		fail_msg("a call failed (%d) across the move", L->failed);
	}
	return mark;
}

static int run_case(struct loop *L, const char *conf, int rdev, int sdev, int count)
{
	L->F = fvh_start(conf);
	fvh_connect(L->F, rdev, sdev, -1);
	return run_connected(L, count);
}

/* The sender's port (mlx5_0) goes down: the send comm moves to mlx5_1, the receiver joins. */
static void test_move_sender_port(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	mark = run_case(&L, roce_two, 1, 0, 60);	/* receiver on mlx5_1, sender on mlx5_0 */
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1", "PORT_ERR on mlx5_0:1");
	assert_moved(mark, "(receive comm) moved from mlx5_1:1 to mlx5_1:1", "PORT_ERR on mlx5_0:1");
	loop_end(&L);
}

/* The receiver's port (mlx5_0) goes down: the receive comm moves to mlx5_1. */
static void test_move_receiver_port(void **state)
{
	struct loop L = { .fault_at = 31, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	mark = run_case(&L, roce_two, 0, 1, 60);	/* receiver on mlx5_0, sender on mlx5_1 */
	assert_moved(mark, "(receive comm) moved from mlx5_0:1 to mlx5_1:1", "PORT_ERR");
	assert_moved(mark, "(send comm) moved from mlx5_1:1 to mlx5_1:1", "PORT_ERR on mlx5_0:1");
	loop_end(&L);
}

/*
 * DEVICE_FATAL on the sender's device with three messages held in flight on
 * it: the dead device completes nothing, so the send comm writes off what
 * its queues owed instead of draining, moves to mlx5_1, and the receiver's
 * record decides what is written again.
 */
static void test_move_device_fatal_sender(void **state)
{
	struct loop L = { .fault_at = 23, .hold_at = 20, .fault_dev = "mlx5_0",
			  .fault = FAULT_DEVICE };
	int mark;

	(void)state;
	mark = run_case(&L, roce_two, 1, 0, 60);	/* receiver on mlx5_1, sender on mlx5_0 */
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1",
		     "DEVICE_FATAL on mlx5_0:1; the peer's side");
	assert_moved(mark, "(send comm) moved from mlx5_0:1", "written off, not drained");
	assert_moved(mark, "(receive comm) moved from mlx5_1:1 to mlx5_1:1", "DEVICE_FATAL");
	loop_end(&L);
}

/* DEVICE_FATAL on the receiver's device: its CQ holds answers it will never poll. */
static void test_move_device_fatal_receiver(void **state)
{
	struct loop L = { .fault_at = 31, .hold_at = 31, .fault_dev = "mlx5_0",
			  .fault = FAULT_DEVICE };
	int mark;

	(void)state;
	mark = run_case(&L, roce_two, 0, 1, 60);	/* receiver on mlx5_0, sender on mlx5_1 */
	assert_moved(mark, "(receive comm) moved from mlx5_0:1 to mlx5_1:1", "DEVICE_FATAL");
	assert_moved(mark, "(send comm) moved from mlx5_1:1 to mlx5_1:1", "DEVICE_FATAL on mlx5_0");
	loop_end(&L);
}

/*
 * QP_FATAL on one of the sender's QPs (it went to error on its own): the
 * comm moves to new QPs on the same device instead of failing.
 */
static void test_move_qp_fatal(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0", .fault = FAULT_QP };
	int mark;

	(void)state;
	mark = run_case(&L, roce_two, 1, 0, 60);	/* receiver on mlx5_1, sender on mlx5_0 */
	if (!fvh_log_count_from(mark, NCCL_LOG_WARN, "moved from mlx5_0:1 to mlx5_0:1",
				"QP_FATAL on mlx5_0:1 qp 0x")) {
		fvh_log_dump();
		fail_msg("no WARN that the send comm moved to new QPs for QP_FATAL");
	}
	loop_end(&L);
}

/*
 * Move-back: mlx5_0 comes back; with NCCL_RAIL_FAILOVER_HOLDDOWN=1 the send
 * comm does not return before it has stayed up 1 s, then returns (an INFO
 * line on each side), and traffic goes on intact throughout.
 */
static void test_move_back_after_holddown(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0" };
	int mark, up;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L.F = fvh_start(roce_two);
	fvh_connect(L.F, 1, 0, -1);	/* receiver on mlx5_1, sender on mlx5_0 */
	mark = fvh_log_mark();
	assert_int_equal(run_to(&L, 40), 0);
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1", "PORT_ERR");
	port_state(L.F, "mlx5_0", IBV_PORT_ACTIVE, NCCL_LOG_INFO, "ACTIVE again");
	up = fvh_log_mark();
	assert_int_equal(run_to(&L, 400), 0);	/* well within the second */
	if (fvh_log_count_from(up, NCCL_LOG_INFO, "moved back", NULL)) {
		fvh_log_dump();
		fail_msg("moved back before the hold-down ended");
	}
	usleep(1100000);
	assert_int_equal(run_to(&L, 1000), 0);
	if (!fvh_log_count_from(up, NCCL_LOG_INFO, "(send comm) moved back from mlx5_1:1 to "
				"mlx5_0:1", "mlx5_0:1 ACTIVE again for 1 s") ||
	    !fvh_log_count_from(up, NCCL_LOG_INFO, "(receive comm) moved back from mlx5_1:1 to "
				"mlx5_1:1", NULL)) {
		fvh_log_dump();
		fail_msg("no move-back INFO on both sides after the hold-down");
	}
	loop_end(&L);
}

/*
 * The path stops with no port event (a far-side cable or switch fault): from
 * message 20 on, mlx5_0 places none of the sender's writes and completes
 * none, and raises nothing. With NCCL_RAIL_IB_STALL_TIMEOUT=1 the stall
 * watchdog moves the send comm to new QPs on mlx5_0 within about a second;
 * the hold then ends (the old QPs' held WRs were flushed when they went to
 * error) and every message arrives intact.
 */
static void test_move_stall(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0",
			  .release_on = "completions owed" };

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	L.F = fvh_start(roce_two);
	fvh_connect(L.F, 1, 0, -1);	/* receiver on mlx5_1, sender on mlx5_0 */
	L.mark = fvh_log_mark();
	if (run_loop(&L, 60)) {
		fvh_log_dump();
		fail_msg("a call failed (%d) across the move", L.failed);
	}
	assert_int_equal(L.held, 2);
	assert_moved(L.mark, "mlx5_0:1 qp 0x", "none polled for 1 s");
	assert_moved(L.mark, "(send comm) moved from mlx5_0:1 to mlx5_0:1", "stall");
	assert_moved(L.mark, "(receive comm) moved from mlx5_1:1 to mlx5_1:1", "stall");
	loop_end(&L);
}

/*
 * The stall stays (mlx5_0 holds its sends for good, its port up): the first
 * stall gives the send comm new QPs on mlx5_0, which stall too; the second,
 * within 60 s, takes it off mlx5_0 to mlx5_1 and the receiver, which cannot
 * tell whose port is behind the fault, off mlx5_2 to mlx5_3; the loop
 * completes.
 */
static void test_move_stall_twice(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	mark = run_case(&L, one_net, 2, 0, 60);	/* receiver on mlx5_2, sender on mlx5_0 */
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_0:1", "stall");
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1",
		     "again within 60 s with the port up: off the device");
	assert_moved(mark, "(receive comm) moved from mlx5_2:1 to mlx5_3:1",
		     "the path failed again within 60 s: off the device");
	loop_end(&L);
}

/*
 * Runs the loop on, every byte checked, until a line at level with a and b
 * appears (from mark on) or ms pass; 1 if it appeared.
 */
static int run_until(struct loop *L, int mark, int level, const char *a, const char *b, int ms)
{
	uint64_t end = rail_now_ns() + (uint64_t)ms * 1000000ull;

	while (!fvh_log_count_from(mark, level, a, b) && rail_now_ns() < end)
		if (run_to(L, L->sent + 20)) {
			fvh_log_dump();
			fail_msg("a call failed (%d) while waiting for \"%s\"", L->failed, a);
		}
	return fvh_log_count_from(mark, level, a, b) != 0;
}

/*
 * test_move_stall_twice's fault, with NCCL_RAIL_FAILOVER_HOLDDOWN=1: both
 * sides end off their devices (mlx5_0 holds its sends, its port up).
 * Returns when, with the log mark from before.
 */
static uint64_t stall_off_both(struct loop *L, int *mark)
{
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L->F = fvh_start(one_net);
	fvh_connect(L->F, 2, 0, -1);	/* receiver on mlx5_2, sender on mlx5_0 */
	*mark = fvh_log_mark();
	if (!run_until(L, *mark, NCCL_LOG_WARN, "(receive comm) moved from mlx5_2:1 to mlx5_3:1",
		       "off the device", 20000)) {
		fvh_log_dump();
		fail_msg("the receive comm did not leave mlx5_2 after the second stall");
	}
	assert_moved(*mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1",
		     "again within 60 s with the port up: off the device");
	return rail_now_ns();
}

/*
 * The move back by probe: the path behind mlx5_0 failed twice with its
 * port up, both sides left their devices (test_move_stall_twice), then the
 * fault is repaired with no port event (the hold ends). A hold-down later
 * the sender's probe (an RDMA READ from mlx5_0 of a buffer on mlx5_2)
 * passes and both sides move back home, each with a line; every message
 * arrives intact throughout, and after. Fails without the probe: nothing
 * ever moves back (no PORT_ACTIVE comes).
 */
static void test_move_back_probe(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	uint64_t off_ns;
	int mark, fixed;

	(void)state;
	off_ns = stall_off_both(&L, &mark);
	assert_true(L.F->hold("mlx5_0", 0) >= 0);	/* repaired: no event says so */
	L.held = 2;
	fixed = fvh_log_mark();
	if (!run_until(&L, fixed, NCCL_LOG_INFO, "(receive comm) moved back from mlx5_3:1 to "
		       "mlx5_2:1", NULL, 10000) ||
	    !fvh_log_count_from(fixed, NCCL_LOG_INFO, "(send comm) moved back from mlx5_1:1 to "
				"mlx5_0:1", "the probe of the way home to mlx5_0:1 passed")) {
		fvh_log_dump();
		fail_msg("no move back on both sides after the path was repaired");
	}
	if (rail_now_ns() - off_ns < 1000000000ull) {
		fvh_log_dump();
		fail_msg("moved back before the hold-down (1 s) ended");
	}
	assert_true(fvh_log_count_from(fixed, NCCL_LOG_INFO, "(send comm): the probe of the way "
				       "home (an RDMA READ from mlx5_0:1", "passed in") == 1);
	assert_true(fvh_log_count_from(fixed, NCCL_LOG_INFO, "(receive comm): the peer's probe of "
				       "the way home", "of mlx5_2:1") == 1);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_WARN, "protocol error", NULL), 0);
	/* the peer's fence for the move back is no second path failure: nobody leaves home */
	assert_int_equal(fvh_log_count_from(fixed, NCCL_LOG_INFO, "moved back", "port up: off the "
					    "device"), 0);
	assert_int_equal(run_to(&L, L.sent + 200), 0);	/* home, intact */
	loop_end(&L);
}

/*
 * The fault stays (mlx5_0 holds its sends for good): every probe's READ is
 * held and fails at its bound, so nothing moves back and traffic goes on
 * on mlx5_1/mlx5_3. The probes go on, less often (a hold-down after the move, then
 * 2 s after a failure, 4 s ...), with one INFO line for the streak, not one per probe.
 */
static void test_move_back_probe_fails(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	char last[FVH_LINE];
	int mark, reads;

	(void)state;
	(void)stall_off_both(&L, &mark);
	(void)run_until(&L, mark, NCCL_LOG_INFO, "nothing", "never", 6000);
	reads = fvh_calls(L.F, 0, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", last);
	if (reads != 2 ||
	    fvh_log_count_from(mark, NCCL_LOG_INFO, "the probe of the way home", "failed") != 1 ||
	    fvh_log_count_from(mark, NCCL_LOG_INFO, "moved back", NULL)) {
		fvh_log_dump();
		fail_msg("%d probes in 6 s (2 expected: at 1 and 4 s), %d failure lines (1), %d move backs "
			 "(none)", reads, fvh_log_count_from(mark, NCCL_LOG_INFO,
							     "the probe of the way home", "failed"),
			 fvh_log_count_from(mark, NCCL_LOG_INFO, "moved back", NULL));
	}
	assert_moved(0, "(send comm) moved from mlx5_0:1 to mlx5_1:1", "off the device");
	if (!fvh_log_count_from(mark, NCCL_LOG_INFO, "from mlx5_0:1 qp 0x", "no completion within "
				"1000 ms; it stays where it is and probes again in 2 s")) {
		fvh_log_dump();
		fail_msg("no INFO naming the failed probe");
	}
	loop_end(&L);
}

static int probe_teardown(void **state)
{
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	unsetenv("NCCL_RAIL_FAILOVER_HOLDDOWN");
	return fvh_teardown(state);
}

/* Calls test() on req for ms milliseconds; it must not complete. */
static void wait_undone(void *req, int ms)
{
	uint64_t end = rail_now_ns() + (uint64_t)ms * 1000000ull;
	int done = 0;

	while (rail_now_ns() < end) {
		assert_int_equal(rail_net_test(req, &done, NULL), ncclSuccess);
		assert_false(done);
	}
}

/*
 * Waiting is no stall: with NCCL_RAIL_IB_STALL_TIMEOUT=1, a sender waits
 * 2 s for a clear-to-send and a receiver 2 s for data (their HCAs owe no
 * completion, though CTS writes went unsignaled): nothing moves, and the
 * message then goes.
 */
static void test_stall_not_waiting(void **state)
{
	struct loop L = { .fault_at = -1 };
	void *rreq = NULL, *sreq = NULL, *data[1] = { rbuf[0] }, *mhs[1];
	size_t sizes[1] = { BUF };
	int tags[1] = { 7 }, done = 0, got[1] = { -1 }, mark;
	uint64_t end;

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	L.F = fvh_start(roce_two);
	fvh_connect(L.F, 1, 0, -1);
	assert_int_equal(run_to(&L, 10), 0);
	mark = fvh_log_mark();
	/* the sender: no receive posted, no CTS; NCCL retries isend */
	fill(sbuf[0], 200000, 5);
	end = rail_now_ns() + 2000000000ull;
	while (rail_now_ns() < end && !sreq)
		assert_int_equal(rail_net_isend(L.F->sc, sbuf[0], 200000, 7, L.smh, &sreq),
				 ncclSuccess);
	assert_null(sreq);
	/* the receiver: a receive posted, nothing sent */
	mhs[0] = L.rmh;
	assert_int_equal(rail_net_irecv(L.F->rc, 1, data, sizes, tags, mhs, &rreq), ncclSuccess);
	assert_non_null(rreq);
	wait_undone(rreq, 2000);
	if (fvh_log_count_from(mark, NCCL_LOG_WARN, "stall", NULL) ||
	    fvh_log_count_from(mark, NCCL_LOG_WARN, "moved", NULL)) {
		fvh_log_dump();
		fail_msg("a comm that only waited was taken for stalled");
	}
	end = rail_now_ns() + 10000000000ull;
	while (!sreq && rail_now_ns() < end)
		assert_int_equal(rail_net_isend(L.F->sc, sbuf[0], 200000, 7, L.smh, &sreq),
				 ncclSuccess);
	assert_non_null(sreq);
	while ((!done || sreq) && rail_now_ns() < end) {
		int sdone = 0;

		if (sreq)
			assert_int_equal(rail_net_test(sreq, &sdone, NULL), ncclSuccess);
		if (sdone)
			sreq = NULL;
		if (!done)
			assert_int_equal(rail_net_test(rreq, &done, got), ncclSuccess);
	}
	assert_true(done);
	assert_null(sreq);
	assert_int_equal(got[0], 200000);
	assert_memory_equal(rbuf[0], sbuf[0], 200000);
	loop_end(&L);
}

static int stall_teardown(void **state)
{
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	return fvh_teardown(state);
}

static int holddown_teardown(void **state)
{
	unsetenv("NCCL_RAIL_FAILOVER_HOLDDOWN");
	return fvh_teardown(state);
}

/*
 * A flapping port (hold-down 0: every flap moves away and back): the fifth
 * move within a minute fails the comm, named, instead of moving forever.
 */
static void test_move_flapping_bounded(void **state)
{
	struct loop L = { .fault_at = -1 };
	int mark, n = 0, err = 0;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "0", 1);
	L.F = fvh_start(roce_two);
	fvh_connect(L.F, 1, 0, -1);	/* receiver on mlx5_1, sender on mlx5_0 */
	mark = fvh_log_mark();
	for (int flap = 0; flap < 3 && !err; flap++) {
		port_state(L.F, "mlx5_0", IBV_PORT_DOWN, NCCL_LOG_WARN, "went down");
		err = run_to(&L, n += 300);
		if (!err)
			port_state(L.F, "mlx5_0", IBV_PORT_ACTIVE, NCCL_LOG_INFO, "ACTIVE again");
		if (!err)
			err = run_to(&L, n += 300);
	}
	assert_int_not_equal(err, 0);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_INFO, "(send comm) moved back", NULL),
			 2);
	if (!fvh_log_count_from(mark, NCCL_LOG_WARN, "5th move within 60 s", "mlx5_0:1")) {
		fvh_log_dump();
		fail_msg("no WARN that the path keeps failing");
	}
	loop_end(&L);
}

/*
 * The side NCCL does not call: the receiver's port goes down and its move
 * starts; the sender's last send (8 bytes into a clear-to-send: an early
 * batch, complete at post) is lost on the way, and NCCL calls only the
 * receiver from then on. The move thread must join the idle send comm to
 * the move and write the piece again from its copy, or the receive never
 * completes.
 */
static void test_move_idle_peer(void **state)
{
	struct loop L = { .fault_at = -1 };
	void *rreq = NULL, *sreq = NULL, *data[1] = { rbuf[0] }, *mhs[1];
	size_t sizes[1] = { BUF };
	int tags[1] = { 7 }, done = 0, got[1] = { -1 }, mark;
	uint64_t deadline;

	(void)state;
	L.F = fvh_start(roce_two);
	fvh_connect(L.F, 0, 1, -1);	/* receiver on mlx5_0, sender on mlx5_1 */
	assert_int_equal(run_to(&L, 10), 0);
	mark = fvh_log_mark();
	mhs[0] = L.rmh;
	assert_int_equal(rail_net_irecv(L.F->rc, 1, data, sizes, tags, mhs, &rreq), 0);
	assert_non_null(rreq);
	port_state(L.F, "mlx5_0", IBV_PORT_DOWN, NCCL_LOG_WARN, "went down");
	/* the receiver's next call starts its move: its QPs go to error first */
	assert_int_equal(rail_net_test(rreq, &done, got), 0);
	assert_false(done);
	fill(sbuf[0], 8, 99);
	assert_int_equal(rail_net_isend(L.F->sc, sbuf[0], 8, 7, L.smh, &sreq), 0);
	assert_non_null(sreq);
	assert_int_equal(rail_net_test(sreq, &done, NULL), 0);
	/* a small send into a clear-to-send: all inline, complete at post (and lost) */
	assert_true(done);
	done = 0;
	deadline = rail_now_ns() + 10000000000ull;
	while (!done && rail_now_ns() < deadline)
		assert_int_equal(rail_net_test(rreq, &done, got), 0);
	if (!done) {
		fvh_log_dump();
		fail_msg("the receive did not complete: the idle sender never joined the move");
	}
	assert_int_equal(got[0], 8);
	fill(sbuf[1], 8, 99);
	assert_memory_equal(rbuf[0], sbuf[1], 8);
	assert_moved(mark, "(receive comm) moved from mlx5_0:1 to mlx5_1:1", "PORT_ERR");
	assert_moved(mark, "(send comm) moved from mlx5_1:1 to mlx5_1:1", "1 lost pieces");
	loop_end(&L);
}

/*
 * The handshake sockets on the interface of one of the ports (here mlx5_0's
 * RoCE address is the loopback address the plugin takes for them): an INFO
 * line at init naming the port (not a WARN: no error, and a common setup), since a move needs those sockets when that
 * port's link fails; none when they are elsewhere, or without failover.
 */
static void test_oob_shared_fate(void **state)
{
	static const char shared[] = "device mlx5_0\n"
				     "port 1 link=eth speed=ndr width=4x\n"
				     "gid 0 fe80::1 type=v1\n"
				     "gid 1 ::ffff:127.0.0.1 type=v2\n"
				     "device mlx5_1\n"
				     "port 1 link=eth speed=ndr width=4x\n"
				     "gid 0 fe80::2 type=v1\n"
				     "gid 1 ::ffff:10.2.0.1 type=v2\n";
	const char *what = "run over the interface of";
	struct fvh *F;

	(void)state;
	F = fvh_start(roce_two);	/* the log starts again with each start */
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, what, NULL), 0);
	fvh_stop(F);
	F = fvh_start(shared);
	if (!fvh_log_count(NCCL_LOG_INFO, what, "mlx5_0:1")) {
		fvh_log_dump();
		fail_msg("no INFO that the handshake sockets share mlx5_0:1's interface");
	}
	fvh_stop(F);
	setenv("NCCL_RAIL_FAILOVER", "0", 1);
	F = fvh_start(shared);
	unsetenv("NCCL_RAIL_FAILOVER");
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, what, NULL), 0);
	fvh_stop(F);
}

/*
 * Rails: the sender's mlx5_0 (rail 1) goes down and it moves to mlx5_1 on
 * rail 2. The receiver's own mlx5_2 is fine but on rail 1: it must follow
 * the peer to its rail (mlx5_3, 10.2.0.0/24), not rebuild on mlx5_2. When
 * mlx5_0 is back for the hold-down, the sender moves back and the receiver
 * follows it home (mlx5_2).
 */
static void test_move_follows_rail(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0" };
	int mark, up;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L.F = fvh_start(roce_rails);
	fvh_connect(L.F, 2, 0, -1);	/* receiver on mlx5_2, sender on mlx5_0: rail 1 */
	mark = fvh_log_mark();
	if (run_to(&L, 60)) {
		fvh_log_dump();
		fail_msg("a call failed (%d) across the move", L.failed);
	}
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1", "PORT_ERR on mlx5_0:1");
	assert_moved(mark, "(receive comm) moved from mlx5_2:1 to mlx5_3:1",
		     "follows the peer to 10.2.0.0/24");
	port_state(L.F, "mlx5_0", IBV_PORT_ACTIVE, NCCL_LOG_INFO, "ACTIVE again");
	up = fvh_log_mark();
	usleep(1100000);
	assert_int_equal(run_to(&L, 600), 0);
	if (!fvh_log_count_from(up, NCCL_LOG_INFO, "(send comm) moved back from mlx5_1:1 to "
				"mlx5_0:1", NULL) ||
	    !fvh_log_count_from(up, NCCL_LOG_INFO, "(receive comm) moved back from mlx5_3:1 to "
				"mlx5_2:1", "follows the peer to 10.1.0.0/24")) {
		fvh_log_dump();
		fail_msg("no move back to rail 1 on both sides after the hold-down");
	}
	loop_end(&L);
}

/*
 * The fallback by the topology (src/topo): a GPU and three RoCE ports
 * under one PCIe switch, the GPU's first choice mlx5_0 (the fastest), the
 * other port of its card mlx5_1, another card mlx5_2; the peer on mlx5_3
 * under another host bridge. mlx5_0 goes down: the prefix of the PCI paths
 * says mlx5_1 (same card), the topology's fallback for the GPU mlx5_2 (as
 * near, and it survives a card failure). The send comm moves to mlx5_2 and
 * says why; fails with the prefix rule alone (it moves to mlx5_1).
 */
static void test_move_topo_fallback(void **state)
{
	static const char conf[] = "gpu 0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0\n"
				   "device mlx5_0 pci=0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.1 type=v2\n"
				   "device mlx5_1 pci=0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.1\n"
				   "port 1 link=eth speed=hdr width=4x\n"
				   "gid 1 ::ffff:10.1.0.2 type=v2\n"
				   "device mlx5_2 pci=0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0\n"
				   "port 1 link=eth speed=hdr width=4x\n"
				   "gid 1 ::ffff:10.1.0.3 type=v2\n"
				   "device mlx5_3 pci=pci0000:80/0000:80:01.0/0000:81:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.4 type=v2\n";
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	mark = run_case(&L, conf, 3, 0, 60);	/* receiver on mlx5_3, sender on mlx5_0 */
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_2:1 (the topology's fallback "
		     "for GPU 0000:03:00.0: PIX, another card)", "PORT_ERR on mlx5_0:1");
	assert_moved(mark, "(receive comm) moved from mlx5_3:1 to mlx5_3:1", "PORT_ERR on mlx5_0:1");
	loop_end(&L);
}

/* No other port: the comm fails, and the WARN says there was nowhere to go. */
static void test_move_nowhere(void **state)
{
	struct loop L = { .fault_at = 5, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	L.F = fvh_start(roce_one);
	fvh_connect(L.F, 0, 0, -1);
	mark = fvh_log_mark();
	assert_int_not_equal(run_loop(&L, 20), 0);
	if (!fvh_log_count_from(mark, NCCL_LOG_WARN, "no other usable port", "mlx5_0:1")) {
		fvh_log_dump();
		fail_msg("no WARN saying no port was left");
	}
	loop_end(&L);
}

/* ---- fused NICs ---------------------------------------------------------------- */

/*
 * Fused NICs: the receiver fuses mlx5_<recv_card>'s two ports, the sender
 * mlx5_<send_card>'s (devices 0, 1: mlx5_0:1, :2; 2, 3: mlx5_1:1, :2).
 */
static void fused_connect(struct fvh *F, int recv_card, int send_card)
{
	int rdevs[2] = { 2 * recv_card, 2 * recv_card + 1 };
	int sdevs[2] = { 2 * send_card, 2 * send_card + 1 };
	int rv = -1, sv = -1;

	assert_int_equal(F->ndev, 4);
	assert_int_equal(rail_net_make_vdevice(&rv, 2, rdevs, 8), ncclSuccess);
	assert_int_equal(rail_net_make_vdevice(&sv, 2, sdevs, 8), ncclSuccess);
	fvh_connect(F, rv, sv, -1);
}

/*
 * The sender's first member (mlx5_0:1) goes down: it moves to the
 * surviving member's port (mlx5_0:2), the second member is rebuilt where
 * it is, and the receiver's two members are rebuilt on theirs.
 */
static void test_move_fused_sender(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0", .fault_port = 1 };
	int mark;

	(void)state;
	L.F = fvh_start(roce_dual);
	fused_connect(L.F, 1, 0);	/* receiver on mlx5_1:1+2, sender on mlx5_0:1+2 */
	mark = run_connected(&L, 60);
	assert_moved(mark, "(send comm) moved from mlx5_0:1+mlx5_0:2 to mlx5_0:2+mlx5_0:2",
		     "PORT_ERR on mlx5_0:1;");
	assert_moved(mark, "(receive comm) moved from mlx5_1:1+mlx5_1:2 to mlx5_1:1+mlx5_1:2",
		     "the peer is on its port 2+2");
	loop_end(&L);
}

/*
 * Partial answers: the sender's card holds its writes from message 16 on,
 * then port 1 goes down and the hold ends: the pieces on port 2's QPs
 * arrive, those on port 1's are lost (flushed by the fence), so each
 * message striped over both members is half answered. The sender must
 * write again exactly the lost halves.
 */
static void test_move_fused_partial(void **state)
{
	struct loop L = { .fault_at = 20, .hold_at = 16, .fault_dev = "mlx5_0", .fault_port = 1 };
	int mark;

	(void)state;
	L.F = fvh_start(roce_dual);
	fused_connect(L.F, 1, 0);	/* receiver on mlx5_1:1+2, sender on mlx5_0:1+2 */
	mark = run_connected(&L, 60);
	assert_moved(mark, "(send comm) moved from mlx5_0:1+mlx5_0:2 to mlx5_0:2+mlx5_0:2",
		     "lost pieces");
	if (fvh_log_count_from(mark, NCCL_LOG_WARN, "(send comm) moved", "; 0 lost pieces")) {
		fvh_log_dump();
		fail_msg("no piece was lost: the test did not test partial answers");
	}
	loop_end(&L);
}

/*
 * Both ports of the sender's card go down, one after the other: first
 * member 0 moves to port 2, then, with no surviving member left, both
 * members move to the fallback device (the other card's first port).
 */
static void test_move_fused_card_down(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0", .fault_port = 1 };
	int mark;

	(void)state;
	L.F = fvh_start(roce_dual);
	fused_connect(L.F, 1, 0);	/* receiver on mlx5_1:1+2, sender on mlx5_0:1+2 */
	mark = fvh_log_mark();
	assert_int_equal(run_to(&L, 40), 0);
	assert_moved(mark, "(send comm) moved from mlx5_0:1+mlx5_0:2 to mlx5_0:2+mlx5_0:2",
		     "PORT_ERR on mlx5_0:1;");
	port_state_at(L.F, "mlx5_0", 2, IBV_PORT_DOWN, NCCL_LOG_WARN, "went down");
	if (run_to(&L, 100)) {
		fvh_log_dump();
		fail_msg("a call failed (%d) across the second move", L.failed);
	}
	assert_moved(mark, "(send comm) moved from mlx5_0:2+mlx5_0:2 to mlx5_1:1+mlx5_1:1",
		     "PORT_ERR on mlx5_0:2+mlx5_0:2;");
	loop_end(&L);
}

/* The receiver's second member (mlx5_0:2) goes down: it moves to mlx5_0:1. */
static void test_move_fused_receiver(void **state)
{
	struct loop L = { .fault_at = 31, .fault_dev = "mlx5_0", .fault_port = 2 };
	int mark;

	(void)state;
	L.F = fvh_start(roce_dual);
	fused_connect(L.F, 0, 1);	/* receiver on mlx5_0:1+2, sender on mlx5_1:1+2 */
	mark = run_connected(&L, 60);
	assert_moved(mark, "(receive comm) moved from mlx5_0:1+mlx5_0:2 to mlx5_0:1+mlx5_0:1",
		     "PORT_ERR on mlx5_0:2;");
	assert_moved(mark, "(send comm) moved from mlx5_1:1+mlx5_1:2 to mlx5_1:1+mlx5_1:2",
		     "the peer is on its port 1+1");
	loop_end(&L);
}

/*
 * Move-back of a fused comm: mlx5_0:1 comes back; after the hold-down (1 s)
 * the sender's first member returns to it, the second stays, and traffic
 * goes on intact throughout.
 */
static void test_move_fused_back(void **state)
{
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0", .fault_port = 1 };
	int mark, up;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L.F = fvh_start(roce_dual);
	fused_connect(L.F, 1, 0);
	mark = fvh_log_mark();
	assert_int_equal(run_to(&L, 40), 0);
	assert_moved(mark, "(send comm) moved from mlx5_0:1+mlx5_0:2 to mlx5_0:2+mlx5_0:2",
		     "PORT_ERR");
	port_state(L.F, "mlx5_0", IBV_PORT_ACTIVE, NCCL_LOG_INFO, "ACTIVE again");
	up = fvh_log_mark();
	assert_int_equal(run_to(&L, 400), 0);
	if (fvh_log_count_from(up, NCCL_LOG_INFO, "moved back", NULL)) {
		fvh_log_dump();
		fail_msg("moved back before the hold-down ended");
	}
	usleep(1100000);
	assert_int_equal(run_to(&L, 1000), 0);
	if (!fvh_log_count_from(up, NCCL_LOG_INFO, "(send comm) moved back from "
				"mlx5_0:2+mlx5_0:2 to mlx5_0:1+mlx5_0:2",
				"mlx5_0:1 ACTIVE again for 1 s") ||
	    !fvh_log_count_from(up, NCCL_LOG_INFO, "(receive comm) moved back from "
				"mlx5_1:1+mlx5_1:2 to mlx5_1:1+mlx5_1:2", "its port 1+2")) {
		fvh_log_dump();
		fail_msg("no move-back INFO on both sides after the hold-down");
	}
	loop_end(&L);
}

/*
 * Fused NICs of two cards each (receiver mlx5_0+mlx5_1, sender
 * mlx5_2+mlx5_3): the failed member moves to the other card, whose
 * registration keys differ, so each member's keys must follow it (the
 * sender's lkeys, the rkeys of every clear-to-send written again).
 */
static void fused_cards_fault(const char *fault_dev, enum fault fault, const char *moved,
			      const char *why, const char *joined)
{
	struct loop L = { .fault_at = 25, .fault_dev = fault_dev, .fault = fault,
			  .hold_at = fault == FAULT_DEVICE ? 22 : 0 };
	int rdevs[2] = { 0, 1 }, sdevs[2] = { 2, 3 }, rv = -1, sv = -1, mark;

	L.F = fvh_start(roce_four);
	assert_int_equal(L.F->ndev, 4);
	assert_int_equal(rail_net_make_vdevice(&rv, 2, rdevs, 8), ncclSuccess);
	assert_int_equal(rail_net_make_vdevice(&sv, 2, sdevs, 8), ncclSuccess);
	fvh_connect(L.F, rv, sv, -1);
	mark = run_connected(&L, 80);
	assert_moved(mark, moved, why);
	assert_moved(mark, joined, "written again");
	loop_end(&L);
}

static void fused_cards(const char *fault_dev, const char *moved, const char *joined)
{
	fused_cards_fault(fault_dev, FAULT_PORT, moved, "PORT_ERR on ", joined);
}

/*
 * The sender's second card (mlx5_3) dies with three messages held on it: its
 * member moves to mlx5_2; the live member's queues are written off with the
 * dead one's (nothing the dead card owed is waited for).
 */
static void test_move_fused_device_fatal(void **state)
{
	(void)state;
	fused_cards_fault("mlx5_3", FAULT_DEVICE,
			  "(send comm) moved from mlx5_2:1+mlx5_3:1 to mlx5_2:1+mlx5_2:1",
			  "DEVICE_FATAL on mlx5_3:1",
			  "(receive comm) moved from mlx5_0:1+mlx5_1:1 to mlx5_0:1+mlx5_1:1");
}

/* The receiver's second member (mlx5_1) goes down: it moves to mlx5_0. */
static void test_move_fused_cards_receiver(void **state)
{
	(void)state;
	fused_cards("mlx5_1", "(receive comm) moved from mlx5_0:1+mlx5_1:1 to mlx5_0:1+mlx5_0:1",
		    "(send comm) moved from mlx5_2:1+mlx5_3:1 to mlx5_2:1+mlx5_3:1");
}

/* The sender's second member (mlx5_3) goes down: it moves to mlx5_2. */
static void test_move_fused_cards_sender(void **state)
{
	(void)state;
	fused_cards("mlx5_3", "(send comm) moved from mlx5_2:1+mlx5_3:1 to mlx5_2:1+mlx5_2:1",
		    "(receive comm) moved from mlx5_0:1+mlx5_1:1 to mlx5_0:1+mlx5_1:1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_move_sender_port, fvh_teardown),
		cmocka_unit_test_teardown(test_move_receiver_port, fvh_teardown),
		cmocka_unit_test_teardown(test_move_device_fatal_sender, fvh_teardown),
		cmocka_unit_test_teardown(test_move_device_fatal_receiver, fvh_teardown),
		cmocka_unit_test_teardown(test_move_qp_fatal, fvh_teardown),
		cmocka_unit_test_teardown(test_move_back_after_holddown, holddown_teardown),
		cmocka_unit_test_teardown(test_move_flapping_bounded, holddown_teardown),
		cmocka_unit_test_teardown(test_move_idle_peer, fvh_teardown),
		cmocka_unit_test_teardown(test_move_stall, stall_teardown),
		cmocka_unit_test_teardown(test_stall_not_waiting, stall_teardown),
		cmocka_unit_test_teardown(test_move_follows_rail, holddown_teardown),
		cmocka_unit_test_teardown(test_move_nowhere, fvh_teardown),
		cmocka_unit_test_teardown(test_oob_shared_fate, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_sender, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_receiver, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_partial, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_card_down, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_back, holddown_teardown),
		cmocka_unit_test_teardown(test_move_fused_cards_receiver, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_cards_sender, fvh_teardown),
		cmocka_unit_test_teardown(test_move_fused_device_fatal, fvh_teardown),
		cmocka_unit_test_teardown(test_move_stall_twice, stall_teardown),
		cmocka_unit_test_teardown(test_move_back_probe, probe_teardown),
		cmocka_unit_test_teardown(test_move_topo_fallback, fvh_teardown),
		cmocka_unit_test_teardown(test_move_back_probe_fails, probe_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_move: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_move: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
