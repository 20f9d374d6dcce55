/*
 * nccl-net-rail unit tests: what verbs failover must never do (src/ib/,
 * docs/FAILOVER.md "Guarantees"), each case on the fake provider, step by
 * step, with more than one registration per side (one registration per
 * side hides stale keys):
 *
 * - re-read a send buffer NCCL has been given back (the receiver's device
 *   dies after its NIC acknowledged a send, before the receiver polled it);
 * - use a key of the device a buffer was on before a move (a receive's
 *   first clear-to-send after the move; a send matched into a grouped
 *   batch before the move and posted after it);
 * - fail a registration made after DEVICE_FATAL and before the move, or
 *   race one made during a move;
 * - drop sends NCCL was told were done when the send comm closes during a
 *   move;
 * - forget ECE, or the eager ring's ordering, on the new QPs of a move;
 * - take a clear-to-send written again that has not fully landed for a
 *   corrupt one.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

uint64_t rail_ib_move_thread_loops(void);	/* src/ib/ib_move_thread.c, for tests */

/* Three RoCE ports on one network: the sender on mlx5_0, the receiver on mlx5_1, a spare. */
static const char three[] = "device mlx5_0 pci=0000:1a:00.0\n"
			    "port 1 link=eth speed=ndr width=4x\n"
			    "gid 1 ::ffff:10.1.0.1 type=v2\n"
			    "device mlx5_1 pci=0000:3b:00.0\n"
			    "port 1 link=eth speed=ndr width=4x\n"
			    "gid 1 ::ffff:10.1.0.2 type=v2\n"
			    "device mlx5_2 pci=0000:3b:00.1\n"
			    "port 1 link=eth speed=ndr width=4x\n"
			    "gid 1 ::ffff:10.1.0.3 type=v2\n";

static const char *const peermem[] = { "/sys/module/nvidia_peermem/version", "580.1\n", NULL };

#define BIG (64 * 1024)
static unsigned char sbuf[2][BIG], rbuf[2][BIG];

#define WAIT_NS (20ull * 1000000000ull)

static void fill(unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 9));
}

static void check(const unsigned char *p, size_t n, int seed, const char *what)
{
	unsigned char want[BIG];

	fill(want, n, seed);
	if (memcmp(p, want, n) != 0) {
		fvh_log_dump();
		fail_msg("%s: the bytes differ from those sent", what);
	}
}

static void *reg(void *comm, void *p, size_t n, int type)
{
	void *mh = NULL;

	assert_int_equal(rail_net_reg_mr(comm, p, n, type, &mh), ncclSuccess);
	return mh;
}

/*
 * The requests of a test, as a proxy thread keeps them: every loop below
 * tests all that are not done (a receive is driven while a send waits),
 * recording when each completed and its size.
 */
#define NRQ 16
static struct {
	void *req;
	int done, size;
} rq[NRQ];
static int nrq;

static void poke(void)
{
	for (int i = 0; i < nrq; i++) {
		int done = 0, sizes[8] = { -1 };

		if (rq[i].done)
			continue;
		if (rail_net_test(rq[i].req, &done, sizes) != ncclSuccess) {
			fvh_log_dump();
			fail_msg("request %d failed", i);
		}
		if (done) {
			rq[i].done = 1;
			rq[i].size = sizes[0];
		}
	}
}

static int track(void *req)
{
	assert_true(nrq < NRQ);
	rq[nrq].req = req;
	rq[nrq].done = 0;
	rq[nrq].size = -1;
	return nrq++;
}

static int send_req(struct fvh *F, void *p, size_t n, int tag, void *mh)
{
	uint64_t end = rail_now_ns() + WAIT_NS;
	void *req = NULL;

	for (;;) {
		ncclResult_t r = rail_net_isend(F->sc, p, n, tag, mh, &req);

		if (r == ncclSuccess && req)
			return track(req);
		if (r != ncclSuccess || rail_now_ns() > end) {
			fvh_log_dump();
			fail_msg("isend of %zu bytes: %s", n, r ? "failed" : "no request in 20 s");
		}
		poke();
	}
}

static int recv_req(struct fvh *F, int n, void **p, size_t *sizes, int *tags, void **mhs)
{
	uint64_t end = rail_now_ns() + WAIT_NS;
	void *req = NULL;

	for (;;) {
		ncclResult_t r = rail_net_irecv(F->rc, n, p, sizes, tags, mhs, &req);

		if (r == ncclSuccess && req)
			return track(req);
		if (r != ncclSuccess || rail_now_ns() > end) {
			fvh_log_dump();
			fail_msg("irecv of %d buffers: %s", n, r ? "failed" : "no request in 20 s");
		}
		poke();
	}
}

static int recv1(struct fvh *F, void *p, size_t n, int tag, void *mh)
{
	void *data[1] = { p }, *mhs[1] = { mh };
	size_t sizes[1] = { n };
	int tags[1] = { tag };

	return recv_req(F, 1, data, sizes, tags, mhs);
}

/* Until every request is done; none may fail. */
static void wait_all(void)
{
	uint64_t end = rail_now_ns() + WAIT_NS;

	for (;;) {
		int left = 0;

		poke();
		for (int i = 0; i < nrq; i++)
			left += !rq[i].done;
		if (!left)
			return;
		if (rail_now_ns() > end) {
			fvh_log_dump();
			fail_msg("%d of %d requests not done after 20 s", left, nrq);
		}
	}
}

/* Receive i completed with size bytes. */
static void assert_size(int i, int size)
{
	if (rq[i].size != size) {
		fvh_log_dump();
		fail_msg("receive %d completed with %d bytes, %d were sent", i, rq[i].size, size);
	}
}

static struct fvh *begin(const char *conf, const char *const *files)
{
	struct fvh *F = fvh_start_with(conf, files);

	nrq = 0;
	fvh_connect(F, 1, 0, -1);	/* receiver on mlx5_1, sender on mlx5_0 */
	return F;
}

static void wait_warn(int mark, const char *a, const char *b)
{
	if (!fvh_wait_log_from(mark, NCCL_LOG_WARN, a, b, 5000)) {
		fvh_log_dump();
		fail_msg("no WARN \"%s ... %s\"", a, b ? b : "");
	}
}

/* Test the requests (which must not complete) until both sides logged their move. */
static void move_on(int mark)
{
	uint64_t end = rail_now_ns() + WAIT_NS;

	while (!fvh_log_count_from(mark, NCCL_LOG_WARN, "(send comm) moved", NULL) ||
	       !fvh_log_count_from(mark, NCCL_LOG_WARN, "(receive comm) moved", NULL)) {
		poke();
		for (int i = 0; i < nrq; i++)
			assert_false(rq[i].done);
		if (rail_now_ns() > end) {
			fvh_log_dump();
			fail_msg("the move did not complete with the requests pending");
		}
	}
}

static void port_down(struct fvh *F, const char *dev)
{
	int mark = fvh_log_mark();

	assert_int_equal(F->port_state(dev, 1, IBV_PORT_DOWN), 1);
	wait_warn(mark, dev, "went down");
}

static void device_fatal(struct fvh *F, const char *dev)
{
	int mark = fvh_log_mark();

	assert_true(F->event(dev, 1, IBV_EVENT_DEVICE_FATAL) >= 1);
	wait_warn(mark, dev, "the device failed");
}

/*
 * The receiver's HCA acknowledged a send (the sender's test() said done,
 * and NCCL wrote the next message into the same buffer), then died before
 * the receiver polled the answer. The move may send the answer again, never
 * the buffer: the first receive holds the first message, whole.
 */
static void test_acked_send_never_reread(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	int r0, r1, s0;

	(void)state;
	F = begin(three, NULL);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	fill(sbuf[0], BIG, 1);
	r0 = recv1(F, rbuf[0], BIG, 7, rmh);	/* its CTS is written at once */
	s0 = send_req(F, sbuf[0], BIG, 7, smh);	/* not tested here: its answer stays unpolled */
	while (!rq[s0].done) {	/* acknowledged by mlx5_1: NCCL has the buffer back */
		int done = 0;

		assert_int_equal(rail_net_test(rq[s0].req, &done, NULL), ncclSuccess);
		rq[s0].done = done;
	}
	fill(sbuf[0], BIG, 2);
	device_fatal(F, "mlx5_1");
	r1 = recv1(F, rbuf[1], BIG, 7, rmh);
	(void)send_req(F, sbuf[0], BIG, 7, smh);
	wait_all();
	assert_size(r0, BIG);
	assert_size(r1, BIG);
	check(rbuf[0], BIG, 1, "receive 0 (its send acknowledged before the device died)");
	check(rbuf[1], BIG, 2, "receive 1");
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fvh_stop(F);
}

/*
 * A small host receive gets no clear-to-send at irecv; posted before a move
 * of the receiver, it gets its first one after (the sender's buffer is GPU
 * memory, so it asks): with the key of the new device. Its registration is
 * not the one later receives use.
 */
static void test_first_cts_after_move_new_key(void **state)
{
	struct fvh *F;
	void *smh, *rmh[2];
	int r0, r1, mark;

	(void)state;
	F = begin(three, peermem);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_CUDA);
	rmh[0] = reg(F->rc, rbuf[0], BIG, NCCL_PTR_HOST);
	rmh[1] = reg(F->rc, rbuf[1], BIG, NCCL_PTR_HOST);
	r0 = recv1(F, rbuf[1], 2048, 7, rmh[1]);
	mark = fvh_log_mark();
	port_down(F, "mlx5_1");
	move_on(mark);
	r1 = recv1(F, rbuf[0], 2048, 7, rmh[0]);
	fill(sbuf[0], 2048, 3);
	fill(sbuf[1], 2048, 4);
	(void)send_req(F, sbuf[0], 2048, 7, smh);
	(void)send_req(F, sbuf[1], 2048, 7, smh);
	wait_all();
	assert_size(r0, 2048);
	assert_size(r1, 2048);
	check(rbuf[1], 2048, 3, "the receive posted before the move");
	check(rbuf[0], 2048, 4, "the receive posted after it");
	fvh_stop(F);
}

/*
 * A grouped receive's clear-to-send; the sender matches its first send (one
 * registration) before its port goes down, its second (another
 * registration) after the move: the batch goes with the new device's keys.
 */
static void test_half_batch_after_move_new_key(void **state)
{
	struct fvh *F;
	void *smh[2], *rmh, *data[2] = { rbuf[0], rbuf[1] }, *mhs[2];
	size_t sizes[2] = { BIG, BIG };
	int tags[2] = { 1, 2 }, mark;

	(void)state;
	F = begin(three, NULL);
	smh[0] = reg(F->sc, sbuf[0], BIG, NCCL_PTR_HOST);
	smh[1] = reg(F->sc, sbuf[1], BIG, NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	mhs[0] = mhs[1] = rmh;
	(void)recv_req(F, 2, data, sizes, tags, mhs);
	fill(sbuf[0], BIG, 5);
	fill(sbuf[1], BIG, 6);
	(void)send_req(F, sbuf[0], BIG, 1, smh[0]);
	mark = fvh_log_mark();
	port_down(F, "mlx5_0");
	move_on(mark);
	(void)send_req(F, sbuf[1], BIG, 2, smh[1]);
	wait_all();
	check(rbuf[0], BIG, 5, "buffer 0 of the grouped receive");
	check(rbuf[1], BIG, 6, "buffer 1 of the grouped receive");
	fvh_stop(F);
}

/* regMr after DEVICE_FATAL on the receiver's device, before anything moved: it works. */
static void test_regmr_after_device_fatal(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	int r0;

	(void)state;
	F = begin(three, NULL);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	device_fatal(F, "mlx5_1");
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	fill(sbuf[0], BIG, 7);
	r0 = recv1(F, rbuf[0], BIG, 7, rmh);
	(void)send_req(F, sbuf[0], BIG, 7, smh);
	wait_all();
	assert_size(r0, BIG);
	check(rbuf[0], BIG, 7, "a receive into a buffer registered after DEVICE_FATAL");
	fvh_stop(F);
}

/* NCCL's service thread registers and deregisters while the comms move. */
struct regger {
	struct fvh *F;
	atomic_int stop;
	int fails, rounds;
};

static void *reg_loop(void *arg)
{
	static unsigned char extra[4][4096];
	struct regger *g = arg;

	while (!atomic_load(&g->stop)) {
		for (int i = 0; i < 4; i++) {
			void *mh = NULL;

			if (rail_net_reg_mr(g->F->rc, extra[i], sizeof(extra[i]), NCCL_PTR_HOST,
					    &mh) != ncclSuccess) {
				g->fails++;
				continue;
			}
			g->fails += rail_net_dereg_mr(g->F->rc, mh) != ncclSuccess;
		}
		g->rounds++;
	}
	return NULL;
}

static void test_regmr_during_moves(void **state)
{
	struct regger g = { 0 };
	pthread_t t;
	void *smh, *rmh;

	(void)state;
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "0", 1);
	g.F = begin(three, NULL);
	smh = reg(g.F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(g.F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	assert_int_equal(pthread_create(&t, NULL, reg_loop, &g), 0);
	for (int i = 0; i < 2; i++) {	/* 4 moves a side: a 5th within 60 s fails the comm */
		int mark = fvh_log_mark(), r;

		fill(sbuf[0], BIG, 10 + i);
		r = recv1(g.F, rbuf[0], BIG, 7, rmh);
		(void)send_req(g.F, sbuf[0], BIG, 7, smh);
		assert_int_equal(g.F->port_state("mlx5_1", 1, IBV_PORT_DOWN), 1);
		wait_warn(mark, "mlx5_1", "went down");
		wait_all();
		assert_size(r, BIG);
		check(rbuf[0], BIG, 10 + i, "a receive across a move");
		mark = fvh_log_mark();
		assert_int_equal(g.F->port_state("mlx5_1", 1, IBV_PORT_ACTIVE), 1);
		(void)fvh_wait_log_from(mark, NCCL_LOG_INFO, "mlx5_1", "ACTIVE", 5000);
	}
	atomic_store(&g.stop, 1);
	pthread_join(t, NULL);
	unsetenv("NCCL_RAIL_FAILOVER_HOLDDOWN");
	assert_int_equal(g.fails, 0);
	assert_true(g.rounds > 0);
	fvh_stop(g.F);
}

/*
 * An eager send NCCL was told is done, lost in the sender's failed path;
 * NCCL closes the send comm before anything moved. Close finishes the move
 * first: the receiver gets the message.
 */
static void test_close_mid_move_delivers(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	int r0;

	(void)state;
	F = begin(three, NULL);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	assert_true(F->hold("mlx5_0", 1) >= 0);
	fill(sbuf[0], 1000, 8);
	(void)send_req(F, sbuf[0], 1000, 7, smh);
	wait_all();	/* eager: done at once, the write held in mlx5_0 */
	port_down(F, "mlx5_0");
	assert_true(F->hold("mlx5_0", 0) >= 0);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_close_send(F->sc), ncclSuccess);
	F->sc = NULL;
	r0 = recv1(F, rbuf[0], 4096, 7, rmh);
	wait_all();
	assert_size(r0, 1000);
	check(rbuf[0], 1000, 8, "an eager message sent before the send comm closed");
	fvh_stop(F);
}

/* ECE on every QP the move builds, as on those of the handshake. */
static void test_ece_after_move(void **state)
{
	static const char ece[] = "device mlx5_0 pci=0000:1a:00.0 ece=0x5\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 1 ::ffff:10.1.0.1 type=v2\n"
				  "device mlx5_1 pci=0000:3b:00.0 ece=0x7\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 1 ::ffff:10.1.0.2 type=v2\n"
				  "device mlx5_2 pci=0000:3b:00.1 ece=0x7\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 1 ::ffff:10.1.0.3 type=v2\n";
	struct fvh *F;
	void *smh, *rmh;
	int mark, calls, sets, r0;

	(void)state;
	F = begin(ece, NULL);
	sets = fvh_calls(F, 0, "ibv_set_ece", "ret=0", NULL, NULL);
	assert_true(sets > 0);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	r0 = recv1(F, rbuf[0], BIG, 7, rmh);
	mark = fvh_log_mark();
	calls = fvh_calls_mark(F);
	port_down(F, "mlx5_1");
	move_on(mark);
	if (fvh_calls(F, calls, "ibv_set_ece", "ret=0", NULL, NULL) < sets) {
		fvh_log_dump();
		fail_msg("the move's new QPs got no ECE (%d ibv_set_ece at connect, fewer after)",
			 sets);
	}
	fill(sbuf[0], BIG, 9);
	(void)send_req(F, sbuf[0], BIG, 7, smh);
	wait_all();
	assert_size(r0, BIG);
	check(rbuf[0], BIG, 9, "a receive across the move");
	fvh_stop(F);
}

/*
 * The receiver moves from ports that place writes in order (the in-order
 * ring) to one that does not (data_in_order 0, reorder): the ring must turn
 * order-safe, or it reads payloads before they landed.
 */
static void test_ring_order_after_move(void **state)
{
	static const char conf[] = "device mlx5_0 pci=0000:1a:00.0 data_in_order=1\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.1 type=v2\n"
				   "device mlx5_1 pci=0000:3b:00.0 data_in_order=1\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.2 type=v2\n"
				   "device mlx5_2 pci=0000:3b:00.1 data_in_order=0 reorder=yes\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.3 type=v2\n";
	struct fvh *F;
	void *smh, *rmh;
	int mark, r;

	(void)state;
	F = begin(conf, NULL);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	r = recv1(F, rbuf[0], 4096, 7, rmh);
	mark = fvh_log_mark();
	port_down(F, "mlx5_1");
	move_on(mark);
	assert_true(fvh_log_count_from(mark, NCCL_LOG_WARN, "moved from mlx5_1:1 to mlx5_2:1",
				       NULL) > 0);
	for (int i = 0; i < 200; i++) {
		size_t n = 300 + (size_t)(i * 37) % 3700;

		if (i)
			r = recv1(F, rbuf[0], 4096, 7, rmh);
		fill(sbuf[0], n, 20 + i);
		(void)send_req(F, sbuf[0], n, 7, smh);
		wait_all();
		assert_size(r, (int)n);
		check(rbuf[0], n, 20 + i, "an eager message after the move");
		nrq = 0;
	}
	fvh_stop(F);
}

/*
 * The sender's NIC places the first entry of a grouped clear-to-send long
 * before the second (reorder_head, reorder_delay). After a move, the
 * receiver writes the CTS being matched again: the sender waits for the
 * whole of it, as when it first loaded it, instead of failing the comm.
 */
static void test_replayed_cts_lands_in_parts(void **state)
{
	static const char conf[] = "device mlx5_0 pci=0000:1a:00.0 reorder=yes reorder_head=64 "
				   "reorder_delay=3000\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.1 type=v2\n"
				   "device mlx5_1 pci=0000:3b:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.2 type=v2\n"
				   "device mlx5_2 pci=0000:3b:00.1\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.3 type=v2\n";
	struct fvh *F;
	void *smh, *rmh, *data[2] = { rbuf[0], rbuf[1] }, *mhs[2];
	size_t sizes[2] = { BIG, BIG };
	int tags[2] = { 1, 2 }, mark;

	(void)state;
	F = begin(conf, NULL);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	mhs[0] = mhs[1] = rmh;
	(void)recv_req(F, 2, data, sizes, tags, mhs);
	fill(sbuf[0], BIG, 11);
	fill(sbuf[1], BIG, 12);
	(void)send_req(F, sbuf[0], BIG, 1, smh);	/* the CTS loaded, half matched */
	mark = fvh_log_mark();
	port_down(F, "mlx5_1");
	move_on(mark);
	(void)send_req(F, sbuf[1], BIG, 2, smh);
	wait_all();
	check(rbuf[0], BIG, 11, "buffer 0 of the grouped receive");
	check(rbuf[1], BIG, 12, "buffer 1 of the grouped receive");
	fvh_stop(F);
}

/* NCCL_IB_RESILIENCY_* set: one INFO line says this plugin's failover applies and how they map. */
static void test_resiliency_vars_named(void **state)
{
	struct fvh *F;

	(void)state;
	setenv("NCCL_IB_RESILIENCY_PORT_FAILOVER", "1", 1);
	setenv("NCCL_IB_RESILIENCY_PORT_RECOVERY", "1", 1);
	F = fvh_start(three);
	unsetenv("NCCL_IB_RESILIENCY_PORT_FAILOVER");
	unsetenv("NCCL_IB_RESILIENCY_PORT_RECOVERY");
	if (fvh_log_count(NCCL_LOG_INFO, "NCCL_IB_RESILIENCY_PORT_FAILOVER=1",
			  "its own failover applies instead (NCCL_RAIL_FAILOVER=1)") != 1 ||
	    fvh_log_count(NCCL_LOG_INFO, "NCCL_IB_RESILIENCY_PORT_RECOVERY=1",
			  "NCCL_RAIL_FAILOVER_HOLDDOWN") != 1) {
		fvh_log_dump();
		fail_msg("no single INFO line naming the NCCL_IB_RESILIENCY_* variables set");
	}
	fvh_stop(F);
}

/*
 * NCCL_RAIL_IB_FLUSH_HOST=1 (host buffers flushed as GPU ones are): a
 * receive comm's host registrations follow a move to another HCA like any
 * (they were taken for DMA-BUF ones whose fd was not kept).
 */
static void test_flush_host_buffers_move(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	int mark, r0;

	(void)state;
	setenv("NCCL_RAIL_IB_FLUSH_HOST", "1", 1);
	F = begin(three, NULL);
	unsetenv("NCCL_RAIL_IB_FLUSH_HOST");
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	r0 = recv1(F, rbuf[0], BIG, 7, rmh);
	mark = fvh_log_mark();
	port_down(F, "mlx5_1");
	move_on(mark);
	fill(sbuf[0], BIG, 13);
	(void)send_req(F, sbuf[0], BIG, 7, smh);
	wait_all();
	assert_size(r0, BIG);
	check(rbuf[0], BIG, 13, "a host receive, flushed, across a move to another HCA");
	fvh_stop(F);
}

/*
 * The sender's path stalls with no port event (its NIC holds its writes)
 * right after eager sends that NCCL was told are done; NCCL never calls the
 * send comm again. The move thread runs its stall watchdog: the comm moves
 * and the receiver gets the messages (NCCL_RAIL_IB_STALL_TIMEOUT=1).
 */
static void test_stall_of_idle_sender(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	int r[2];

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	F = begin(three, NULL);
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	assert_true(F->hold("mlx5_0", 1) >= 0);
	fill(sbuf[0], 1000, 14);
	fill(sbuf[1], 3000, 15);
	(void)send_req(F, sbuf[0], 1000, 7, smh);
	(void)send_req(F, sbuf[1], 3000, 7, smh);
	wait_all();	/* eager: done at once, the writes held in mlx5_0 */
	nrq = 0;
	r[0] = recv1(F, rbuf[0], 4096, 7, rmh);
	r[1] = recv1(F, rbuf[1], 4096, 7, rmh);
	wait_all();	/* only the receiver is called */
	assert_size(r[0], 1000);
	assert_size(r[1], 3000);
	check(rbuf[0], 1000, 14, "the first eager message");
	check(rbuf[1], 3000, 15, "the second eager message");
	if (!fvh_log_count(NCCL_LOG_WARN, "the move thread on mlx5_0:1", "completions owed")) {
		fvh_log_dump();
		fail_msg("no stall WARN from the move thread");
	}
	assert_true(F->hold("mlx5_0", 0) >= 0);
	fvh_stop(F);
}

/*
 * The sweep stops once every comm is quiet (nothing owed, no request, the
 * tail of unsignaled writes probed and polled): with the stall timeout at
 * 1 s (a sweep every 0.5 s), the move thread must stop waking within 4 s of
 * the last call, and stay asleep for 2 s. NCCL's next call on a quiet comm
 * wakes it: a stall behind that sender, which NCCL then leaves alone, is
 * still found (without the wake-up, the sweep's timer stays off).
 */
static void test_stall_after_quiet(void **state)
{
	struct fvh *F;
	void *smh, *rmh;
	uint64_t end, l0 = 0;
	int r, still = 0;

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	F = begin(three, NULL);
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	fill(sbuf[0], 1000, 17);
	r = recv1(F, rbuf[0], 4096, 7, rmh);
	(void)send_req(F, sbuf[0], 1000, 7, smh);
	wait_all();
	assert_size(r, 1000);
	check(rbuf[0], 1000, 17, "the message before the quiet");
	end = rail_now_ns() + 4000000000ull;
	while (still < 10 && rail_now_ns() < end) {	/* 10 x 0.2 s without a wake-up */
		uint64_t l = rail_ib_move_thread_loops();

		still = l == l0 ? still + 1 : 0;
		l0 = l;
		usleep(200000);
	}
	if (still < 10)
		fail_msg("the move thread still woke 4 s after the last call (sweeps of quiet comms)");
	assert_true(F->hold("mlx5_0", 1) >= 0);
	fill(sbuf[1], 2000, 18);
	nrq = 0;
	(void)send_req(F, sbuf[1], 2000, 7, smh);
	wait_all();	/* eager: done at once, the writes held in mlx5_0 */
	nrq = 0;
	r = recv1(F, rbuf[1], 4096, 7, rmh);
	wait_all();	/* only the receiver is called */
	assert_size(r, 2000);
	check(rbuf[1], 2000, 18, "the message after the quiet");
	if (!fvh_log_count(NCCL_LOG_WARN, "the move thread on mlx5_0:1", "completions owed")) {
		fvh_log_dump();
		fail_msg("no stall WARN from the move thread after the quiet");
	}
	assert_true(F->hold("mlx5_0", 0) >= 0);
	fvh_stop(F);
}

/*
 * Not a failover case; found by the failover search. A sender of GPU memory
 * (no eager) whose sends of two tags wait for clear-to-sends that small
 * host receives get only when asked: each tag's "want" waits 2 ms when the
 * tag's receives were large, and the refused sends of the two tags, tried
 * in turn as NCCL's channels do, restarted each other's wait for ever.
 */
static void test_wants_of_two_tags(void **state)
{
	struct fvh *F;
	void *smh, *rmh, *sreq[2] = { NULL, NULL };
	uint64_t end;
	int r[2];

	(void)state;
	F = begin(three, peermem);
	smh = reg(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_CUDA);
	rmh = reg(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST);
	for (int tag = 1; tag <= 2; tag++) {	/* large receives first: the tags' CTSes are big */
		r[0] = recv1(F, rbuf[tag - 1], BIG, tag, rmh);
		(void)send_req(F, sbuf[tag - 1], BIG, tag, smh);
	}
	wait_all();
	nrq = 0;
	r[0] = recv1(F, rbuf[0], 100, 1, rmh);
	r[1] = recv1(F, rbuf[1], 100, 2, rmh);
	fill(sbuf[0], 100, 16);
	fill(sbuf[1], 100, 17);
	end = rail_now_ns() + WAIT_NS;
	while (!sreq[0] || !sreq[1]) {	/* the two channels' isends in turn */
		for (int k = 0; k < 2; k++)
			if (!sreq[k])
				assert_int_equal(rail_net_isend(F->sc, sbuf[k], 100, k + 1, smh, &sreq[k]),
						 ncclSuccess);
		poke();
		if (rail_now_ns() > end) {
			fvh_log_dump();
			fail_msg("the sends of two tags waited 20 s for their clear-to-sends");
		}
	}
	(void)track(sreq[0]);
	(void)track(sreq[1]);
	wait_all();
	assert_size(r[0], 100);
	assert_size(r[1], 100);
	check(rbuf[0], 100, 16, "tag 1");
	check(rbuf[1], 100, 17, "tag 2");
	fvh_stop(F);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_acked_send_never_reread, fvh_teardown),
		cmocka_unit_test_teardown(test_first_cts_after_move_new_key, fvh_teardown),
		cmocka_unit_test_teardown(test_half_batch_after_move_new_key, fvh_teardown),
		cmocka_unit_test_teardown(test_regmr_after_device_fatal, fvh_teardown),
		cmocka_unit_test_teardown(test_regmr_during_moves, fvh_teardown),
		cmocka_unit_test_teardown(test_close_mid_move_delivers, fvh_teardown),
		cmocka_unit_test_teardown(test_ece_after_move, fvh_teardown),
		cmocka_unit_test_teardown(test_ring_order_after_move, fvh_teardown),
		cmocka_unit_test_teardown(test_replayed_cts_lands_in_parts, fvh_teardown),
		cmocka_unit_test_teardown(test_resiliency_vars_named, fvh_teardown),
		cmocka_unit_test_teardown(test_flush_host_buffers_move, fvh_teardown),
		cmocka_unit_test_teardown(test_stall_of_idle_sender, fvh_teardown),
		cmocka_unit_test_teardown(test_stall_after_quiet, fvh_teardown),
		cmocka_unit_test_teardown(test_wants_of_two_tags, fvh_teardown),
	};

	if (!fvh_find_lib()) {
		print_message("SKIP: the fake verbs library was not found (make tests builds it)\n");
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
