/*
 * nccl-net-rail unit tests: the transfer loop of the failover tests on the
 * fake provider (test_ib_move.c, test_ib_move_back.c): two comms polled as
 * a proxy thread polls them, messages of mixed sizes (eager, clear-to-send,
 * larger than a send queue's inline size) with every byte checked, and a
 * fault injected at a chosen message (a port down, DEVICE_FATAL, QP_FATAL,
 * a device holding its sends). Include after unit.h and fv_harness.h in
 * one test file.
 */
#ifndef RAIL_MOVE_LOOP_H
#define RAIL_MOVE_LOOP_H

#include <infiniband/verbs.h>

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

static inline void port_state_at(struct fvh *F, const char *dev, int port, int state, int level,
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

static inline void port_state(struct fvh *F, const char *dev, int state, int level, const char *what)
{
	port_state_at(F, dev, 1, state, level, what);
}

static inline void fill(unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

static inline size_t msg_size(int i)
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
	int release_ms;		/* ... this long after the WARN was seen (0: at once) */
	uint64_t release_ns;	/* when the hold ends, once the WARN was seen */
	int mark;		/* ... looked for from this log mark */
	int failed;		/* a call failed: its ncclResult_t */
	void *sreq[WIN], *rreq[WIN];
	int sent, recvd, sdone, rdone;	/* messages posted / completed per side */
};

/* The receive of message i completed with got bytes: check every byte. */
static inline void check_recv(int i, int got)
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
static inline void inject(struct loop *L)
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
static inline int turn(struct loop *L, int count)
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
	if (!r && L->held == 1 && L->release_on && !L->release_ns &&
	    fvh_log_count_from(L->mark, NCCL_LOG_WARN, L->release_on, NULL))
		L->release_ns = rail_now_ns() + (uint64_t)L->release_ms * 1000000ull;
	if (!r && L->held == 1 && L->release_ns && rail_now_ns() >= L->release_ns) {
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
static inline int run_to(struct loop *L, int count)
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

static inline int run_loop(struct loop *L, int count)
{
	return run_to(L, count);
}

static inline void loop_end(struct loop *L)
{
	assert_int_equal(rail_net_dereg_mr(L->F->sc, L->smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L->F->rc, L->rmh), ncclSuccess);
	fvh_stop(L->F);
}

static inline void assert_moved(int from, const char *kind, const char *devs)
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
static inline int run_connected(struct loop *L, int count)
{
	int mark = fvh_log_mark();

	if (run_loop(L, count)) {
		fvh_log_dump();
		fail_msg("a call failed (%d) across the move", L->failed);
	}
	return mark;
}

static inline int run_case(struct loop *L, const char *conf, int rdev, int sdev, int count)
{
	L->F = fvh_start(conf);
	fvh_connect(L->F, rdev, sdev, -1);
	return run_connected(L, count);
}

/*
 * Runs the loop on, every byte checked, until a line at level with a and b
 * appears (from mark on) or ms pass; 1 if it appeared.
 */
static inline int run_until(struct loop *L, int mark, int level, const char *a, const char *b, int ms)
{
	uint64_t end = rail_now_ns() + (uint64_t)ms * 1000000ull;

	while (!fvh_log_count_from(mark, level, a, b) && rail_now_ns() < end)
		if (run_to(L, L->sent + 20)) {
			fvh_log_dump();
			fail_msg("a call failed (%d) while waiting for \"%s\"", L->failed, a);
		}
	return fvh_log_count_from(mark, level, a, b) != 0;
}

#endif
