/*
 * nccl-net-rail unit tests: one-sided RMA through the exported table.
 *
 * The built plugin is loaded with dlopen and ncclRmaPlugin_v14 looked up,
 * as NCCL 2.30.7 does; nothing of the core is linked. Ranks are threads of
 * this process over loopback TCP (NCCL_RAIL_TRANSPORT=tcp,
 * NCCL_SOCKET_IFNAME=lo), each with its own contexts, collComm and windows,
 * as NCCL's communicators in one process are.
 * Skips, saying why, when the plugin is not built.
 */
#include "unit.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rail.h"
#include "rma_harness.h"
#include "rma_v14.h"

static char plugin[PATH_MAX];
static void *lib;
static ncclRma_v14_t *rma;

#define MAXR RMAH_MAXR
#define WAIT_NS (30ull * 1000000000ull)
#define HSIZE RMAH_HSIZE

/*
 * A group: n ranks (threads), each an NCCL communicator of its own: init,
 * listen, the handles allgathered, connect, a context of nctx channels with
 * the given stride, and three symmetric windows: src (what it puts), win
 * (what peers put into: n slots), sig (n + 1 signal words).
 */
struct rank;
typedef void (*body_fn)(struct rank *r);

struct grp {
	struct rmah_group h;	/* n, handles, hptr, bar */
	int nctx;
	int stride;
	size_t slot;
	int stagger_ms;		/* rank r reaches connect r x this late */
	body_fn body;
	struct rank *r[MAXR];
};

struct rank {
	struct grp *g;
	int rank;
	void *ctx, *lc, *coll, *rctx;
	char *src, *win;
	uint64_t *sig;
	void *src_mh, *win_mh, *sig_mh;
	char fail[512];
};

/* Test until done: the result of the last test (a timeout fails the rank). */
static ncclResult_t wait_req(struct rank *r, void *req)
{
	ncclResult_t res;
	int done = rmah_test_until(rma->test, r->coll, req, WAIT_NS, 0, &res);

	RCHECK(r, res != ncclSuccess || done, "request %p not done in 30 s", req);
	return res;
}

/* The signal word of rank from reaches at least want (the applier does it alone). */
static int wait_sig(struct rank *r, int from, uint64_t want)
{
	if (rmah_wait_word(&r->sig[from], want, WAIT_NS))
		return 1;
	RFAIL(r, "rank %d: signal of rank %d is %llu, waited for %llu", r->rank, from,
	      (unsigned long long)r->sig[from], (unsigned long long)want);
	return 0;
}

static void rank_up(struct rank *r)
{
	struct grp *g = r->g;
	ncclRmaConfig_v14_t cfg = { .nContexts = g->nctx, .trafficClass = -1,
				    .rankStride = g->stride };
	size_t wsize = (size_t)g->h.n * g->slot;

	ROK(r, rma->init(&r->ctx, 0x1000 + (uint64_t)r->rank, unit_log_sink));
	ROK(r, rma->listen(r->ctx, 0, g->h.handles[r->rank], &r->lc));
	pthread_barrier_wait(&g->h.bar);		/* NCCL's allgather of the handles */
	usleep((useconds_t)(g->stagger_ms * r->rank) * 1000);
	/* NCCL 2.30.7's host RMA passes another plugin's context here: never read. */
	ROK(r, rma->connect((void *)(uintptr_t)0x7a7a7a7a7a7a7a7aull, g->h.hptr, g->h.n, r->rank,
			    r->lc, &r->coll));
	ROK(r, rma->closeListen(r->lc));
	ROK(r, rma->createContext(r->coll, &cfg, &r->rctx));
	r->src = calloc(1, wsize);
	r->win = calloc(1, wsize);
	r->sig = calloc((size_t)g->h.n + 1, 8);
	ROK(r, rma->regMrSym(r->coll, r->src, wsize, NCCL_PTR_HOST, 0, &r->src_mh));
	ROK(r, rma->regMrSym(r->coll, r->win, wsize, NCCL_PTR_HOST, 0, &r->win_mh));
	ROK(r, rma->regMrSym(r->coll, r->sig, ((size_t)g->h.n + 1) * 8, NCCL_PTR_HOST,
			     NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET,
			     &r->sig_mh));
}

static void rank_down(struct rank *r)
{
	pthread_barrier_wait(&r->g->h.bar);	/* nobody puts into what is going away */
	if (r->coll) {
		ROK(r, rma->deregMrSym(r->coll, r->src_mh));
		ROK(r, rma->deregMrSym(r->coll, r->win_mh));
		ROK(r, rma->deregMrSym(r->coll, r->sig_mh));
		ROK(r, rma->destroyContext(r->rctx));
		ROK(r, rma->closeColl(r->coll));
	}
	ROK(r, rma->finalize(r->ctx));
	free(r->src);
	free(r->win);
	free(r->sig);
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;

	rank_up(r);
	pthread_barrier_wait(&r->g->h.bar);
	if (!r->fail[0])
		r->g->body(r);
	rank_down(r);
	return NULL;
}

/* Run body on n ranks; fail the test with the first rank's failure. */
static int next_stagger_ms;

static void run_group(int n, int nctx, int stride, size_t slot, body_fn body)
{
	struct grp g = { .nctx = nctx, .stride = stride, .slot = slot, .body = body,
			 .stagger_ms = next_stagger_ms };
	struct rank rs[MAXR];
	const char *fail;

	memset(rs, 0, sizeof(rs));
	for (int i = 0; i < n; i++) {
		rs[i].g = &g;
		rs[i].rank = i;
		g.r[i] = &rs[i];
	}
	fail = RMAH_RUN(&g.h, n, rs, rank_main);
	if (fail) {
		unit_log_dump();
		fail_msg("%s", fail);
	}
}

/* ---- the tests ------------------------------------------------------------- */

static void test_exported(void **state)
{
	(void)state;
	assert_non_null(rma);
	assert_string_equal(rma->name, "Rail");
	/* Every slot NCCL calls without checking is set. */
	assert_non_null(rma->init);
	assert_non_null(rma->finalize);
	assert_non_null(rma->iput);
	assert_non_null(rma->iputSignal);
	assert_non_null(rma->iget);
	assert_non_null(rma->test);
}

/* NCCL_RAIL_RMA=0: init declines (NCCL moves on to its own backend), saying why. */
static void test_off_declines(void **state)
{
	void *ctx = NULL;

	(void)state;
	setenv("NCCL_RAIL_RMA", "0", 1);
	unit_log_reset();
	assert_int_not_equal(rma->init(&ctx, 1, unit_log_sink), ncclSuccess);
	unsetenv("NCCL_RAIL_RMA");
	assert_null(ctx);
	unit_assert_logged2(RAIL_LOG_INFO, "RMA (ABI v14): not offered", "NCCL_RAIL_RMA=0");
	assert_int_equal(rma->finalize(NULL), ncclSuccess);
}

/* Served over TCP: the net table's devices, the GIN proxy type, one receive. */
static void test_devices_are_the_net_ones(void **state)
{
	ncclNet_v12_t *net = dlsym(lib, "ncclNetPlugin_v12");
	ncclNetProperties_v12_t np, rp;
	void *ctx = NULL, *nctx = NULL;
	int nn = 0, nr = 0;

	(void)state;
	unit_log_reset();
	assert_int_equal(rma->init(&ctx, 1, unit_log_sink), ncclSuccess);
	unit_assert_logged2(RAIL_LOG_INFO, "RMA (ABI v14): served by the tcp backend",
			    "GPU windows through the CUDA driver");
	assert_int_equal(net->init(&nctx, 2, NULL, unit_log_sink, NULL), ncclSuccess);
	assert_int_equal(rma->devices(&nr), ncclSuccess);
	assert_int_equal(net->devices(&nn), ncclSuccess);
	assert_true(nr >= 1);
	assert_int_equal(nr, nn);
	for (int d = 0; d < nr; d++) {
		assert_int_equal(rma->getProperties(d, &rp), ncclSuccess);
		assert_int_equal(net->getProperties(d, &np), ncclSuccess);
		assert_string_equal(rp.name, np.name);
		assert_true(rp.pciPath == np.pciPath ||
			    (rp.pciPath && np.pciPath && !strcmp(rp.pciPath, np.pciPath)));
		assert_int_equal(rp.guid, np.guid);
		assert_int_equal(rp.speed, np.speed);
		assert_int_equal(rp.port, np.port);
		assert_int_equal(rp.ptrSupport, np.ptrSupport);
		assert_int_equal(rp.ptrSupport, NCCL_PTR_HOST);
		assert_int_equal(rp.netDeviceType, NCCL_NET_DEVICE_GIN_PROXY);
		assert_int_equal(rp.maxRecvs, 1);
		assert_int_equal(rp.railId, np.railId);
	}
	assert_int_not_equal(rma->getProperties(nr, &rp), ncclSuccess);
	assert_int_equal(net->finalize(nctx), ncclSuccess);
	assert_int_equal(rma->finalize(ctx), ncclSuccess);
	/* Once the last RMA context is gone, so is the offer (the WARN goes to stderr). */
	assert_int_not_equal(rma->devices(&nr), ncclSuccess);
}

/*
 * Every rank puts a pattern into its slot of every rank's window, itself
 * included, with a signal (INC from even ranks, ADD 1000 + rank from odd
 * ones) on context n - 1; each target waits for every signal and checks
 * every byte. Then every rank gets every slot of every rank's window back
 * and checks it, and a flush has nothing to wait for.
 */
static void body_put_signal_get(struct rank *r)
{
	struct grp *g = r->g;
	void *req[MAXR];
	int ctx = g->nctx - 1;

	for (size_t i = 0; i < g->slot; i++)
		for (int p = 0; p < g->h.n; p++)
			r->src[(size_t)p * g->slot + i] = (char)rmah_pattern(r->rank, p, i);
	for (int p = 0; p < g->h.n; p++) {
		ROK(r, rma->iputSignal(r->rctx, ctx, (uint64_t)p * g->slot, r->src_mh, g->slot,
				       (uint64_t)r->rank * g->slot, r->win_mh, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->sig_mh, 1000 + (uint64_t)r->rank,
				       r->rank % 2 ? NCCL_NET_SIGNAL_OP_ADD : NCCL_NET_SIGNAL_OP_INC,
				       true, &req[p]));
		RCHECK(r, req[p] != NULL, "iputSignal to rank %d gave no request", p);
	}
	for (int p = 0; p < g->h.n; p++)
		ROK(r, wait_req(r, req[p]));
	for (int q = 0; q < g->h.n; q++) {
		if (!wait_sig(r, q, q % 2 ? 1000 + (uint64_t)q : 1))
			return;
		RCHECK(r, r->sig[q] == (q % 2 ? 1000 + (uint64_t)q : 1), "signal %d is %llu", q,
		       (unsigned long long)r->sig[q]);
		for (size_t i = 0; i < g->slot; i++) {
			if ((uint8_t)r->win[(size_t)q * g->slot + i] != rmah_pattern(q, r->rank, i)) {
				RFAIL(r, "rank %d: byte %zu from rank %d is wrong", r->rank, i, q);
				return;
			}
		}
	}
	pthread_barrier_wait(&g->h.bar);	/* every window complete: read them back */
	for (int p = 0; p < g->h.n; p++) {
		for (int q = 0; q < g->h.n; q++) {
			void *rq = NULL;

			ROK(r, rma->iget(r->rctx, 0, (uint64_t)q * g->slot, r->win_mh, g->slot,
					 (uint64_t)q * g->slot, r->src_mh, (uint32_t)p, &rq));
			RCHECK(r, rq != NULL, "iget from rank %d gave no request", p);
			ROK(r, wait_req(r, rq));
			for (size_t i = 0; i < g->slot; i++) {
				if ((uint8_t)r->src[(size_t)q * g->slot + i] != rmah_pattern(q, p, i)) {
					RFAIL(r, "rank %d: iget from rank %d, slot %d: byte %zu is wrong",
					      r->rank, p, q, i);
					return;
				}
			}
		}
		void *fl = (void *)1;

		ROK(r, rma->iflush(r->rctx, 0, r->sig_mh, (uint32_t)r->rank, &fl));
		RCHECK(r, fl == NULL, "%s", "iflush handed out a request");
	}
}

static void test_put_signal_get_2(void **state)
{
	(void)state;
	run_group(1, 1, 1, 4096, body_put_signal_get);	/* a group of one: all to self */
	run_group(2, 2, 1, 64 << 10, body_put_signal_get);
}

static void test_put_signal_get_4(void **state)
{
	(void)state;
	run_group(4, 2, 1, 1 << 20, body_put_signal_get);
}

/*
 * Size 0 with NULL handles: a signal alone (ncclSignal, GIN's VA signal) and
 * a put of nothing; both give a request that completes, to peers and to self.
 */
static void body_size0(struct rank *r)
{
	struct grp *g = r->g;

	for (int p = 0; p < g->h.n; p++) {
		void *a = NULL, *b = NULL;

		ROK(r, rma->iput(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)p, &a));
		void *c = NULL;

		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->sig_mh, 5, NCCL_NET_SIGNAL_OP_ADD,
				       true, &b));
		ROK(r, rma->iget(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)p, &c));
		RCHECK(r, a && b && c, "requests %p %p %p", a, b, c);
		ROK(r, wait_req(r, a));
		ROK(r, wait_req(r, b));
		ROK(r, wait_req(r, c));
	}
	for (int q = 0; q < g->h.n; q++) {
		wait_sig(r, q, 5);
		RCHECK(r, r->sig[q] == 5, "signal of rank %d is %llu", q,
		       (unsigned long long)r->sig[q]);
	}
}

static void test_size0_null_handles(void **state)
{
	(void)state;
	run_group(2, 1, 1, 4096, body_size0);
	run_group(3, 1, 1, 4096, body_size0);
	run_group(4, 1, 1, 4096, body_size0);
}

/*
 * Ordering under load: every rank sends its right neighbour many puts of
 * mixed sizes (1 byte to 1 MiB, overlapping, later ones over earlier ones,
 * 32 in flight), then a signal of size 0; once the signal is there, the
 * target checks every byte of the window against the same writes replayed
 * in order. A signal applied before an earlier put's bytes, or two puts
 * applied out of order, leaves a wrong byte.
 */
#define LOAD_PUTS 400

static size_t load_size(unsigned i)
{
	static const size_t sizes[] = { 1, 7, 64, 4096, 65536, 100000, 1 << 20, 3 };

	return sizes[(i * 7 + i / 3) % 8];
}

static size_t load_off(unsigned i, size_t size, size_t wsize)
{
	return ((size_t)i * 104729u) % (wsize - size + 1);
}

static void load_replay(char *ref, int from, size_t wsize)
{
	for (unsigned i = 0; i < LOAD_PUTS; i++) {
		size_t size = load_size(i), off = load_off(i, size, wsize);

		for (size_t b = 0; b < size; b++)
			ref[off + b] = (char)(from + i * 3 + b);
	}
}

static void body_load(struct rank *r)
{
	struct grp *g = r->g;
	size_t wsize = (size_t)g->h.n * g->slot;
	int to = (r->rank + 1) % g->h.n, from = (r->rank + g->h.n - 1) % g->h.n;
	char *ref = calloc(1, wsize);
	void *req[32] = { 0 };

	for (unsigned i = 0; i < LOAD_PUTS && !r->fail[0]; i++) {
		size_t size = load_size(i), off = load_off(i, size, wsize);

		if (req[i % 32])
			ROK(r, wait_req(r, req[i % 32]));
		/* A fresh source each time: a put whose bytes left late would carry these. */
		for (size_t b = 0; b < size; b++)
			r->src[off + b] = (char)(r->rank + i * 3 + b);
		ROK(r, rma->iput(r->rctx, 1, off, r->src_mh, size, off, r->win_mh, (uint32_t)to,
				 &req[i % 32]));
		/* The put is done only when its source may be reused: wait, then reuse. */
		ROK(r, wait_req(r, req[i % 32]));
		req[i % 32] = NULL;
	}
	ROK(r, rma->iputSignal(r->rctx, 1, 0, NULL, 0, 0, NULL, (uint32_t)to,
			       (uint64_t)r->rank * 8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true,
			       &req[0]));
	ROK(r, wait_req(r, req[0]));
	load_replay(ref, from, wsize);
	if (wait_sig(r, from, 1)) {
		for (size_t b = 0; b < wsize; b++) {
			if (r->win[b] != ref[b]) {
				RFAIL(r, "rank %d: byte %zu from rank %d is %d, the writes in order "
				      "leave %d", r->rank, b, from, r->win[b], ref[b]);
				break;
			}
		}
	}
	free(ref);
}

/*
 * The same with puts in flight together: each source range is written once
 * and never reused, so 32 puts stay posted while the signal follows them.
 */
static void body_load_inflight(struct rank *r)
{
	struct grp *g = r->g;
	size_t half = (size_t)g->h.n * g->slot / 2;
	int to = (r->rank + 1) % g->h.n, from = (r->rank + g->h.n - 1) % g->h.n;
	void *req[32] = { 0 };
	unsigned k = 0;

	for (size_t b = 0; b < half; b++)
		r->src[b] = (char)(r->rank * 5 + b / 7);
	for (size_t off = 0; off < half && !r->fail[0]; k++) {
		size_t size = RAIL_MIN(load_size(k), half - off);

		if (req[k % 32])
			ROK(r, wait_req(r, req[k % 32]));
		ROK(r, rma->iput(r->rctx, 0, off, r->src_mh, size, off, r->win_mh, (uint32_t)to,
				 &req[k % 32]));
		off += size;
	}
	ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to,
			       (uint64_t)r->rank * 8, r->sig_mh, 7, NCCL_NET_SIGNAL_OP_ADD, true,
			       &req[k % 32 == 0 ? 31 : (k - 1) % 32]));
	for (int i = 0; i < 32; i++) {
		if (req[i])
			ROK(r, wait_req(r, req[i]));
	}
	if (!wait_sig(r, from, 7))
		return;
	for (size_t b = 0; b < half; b++) {
		if (r->win[b] != (char)(from * 5 + b / 7)) {
			RFAIL(r, "rank %d: byte %zu from rank %d is wrong once its signal came",
			      r->rank, b, from);
			return;
		}
	}
}

static void test_ordering_under_load(void **state)
{
	(void)state;
	run_group(2, 2, 1, 2 << 20, body_load);
	run_group(4, 2, 1, 1 << 20, body_load);
	run_group(2, 1, 1, 8 << 20, body_load_inflight);
	run_group(4, 1, 1, 2 << 20, body_load_inflight);
	/* Small socket buffers: the streams back up and operations wait in their queues. */
	setenv("NCCL_SOCKET_SNDBUF", "16k", 1);
	setenv("NCCL_SOCKET_RCVBUF", "16k", 1);
	run_group(2, 1, 1, 8 << 20, body_load_inflight);
	run_group(3, 2, 1, 1 << 20, body_load);
	unsetenv("NCCL_SOCKET_SNDBUF");
	unsetenv("NCCL_SOCKET_RCVBUF");
}

/*
 * A seeded randomized search of ordering with striped puts (rma_tcp.h,
 * Lanes): in each round every rank sends its right neighbour puts of sizes
 * and offsets drawn from the seed (small ones on the stream, large ones
 * striped over the lanes, overlapping each other), four in flight, each from
 * its own quarter of the source, then a signal (carried by the round's last
 * put, or alone). Once the signal is there, every byte of the window must be
 * what the puts of every round so far leave in program order; the ranks
 * meet before the next round. RMA_SEED=N replays a seed's plan.
 */
#define SEED_PUTS 40
#define SEED_ROUNDS 3

struct seed_put {
	size_t size, off;
};

static void seed_plan(unsigned seed, int from, int round, size_t wsize, struct seed_put *p)
{
	unsigned s = seed * 2654435761u + (unsigned)from * 7919u + (unsigned)round * 104729u + 1;
	size_t quarter = wsize / 4;

	for (int i = 0; i < SEED_PUTS; i++) {
		unsigned kind;

		s = s * 1103515245u + 12345u;
		kind = (s >> 16) % 20;
		s = s * 1103515245u + 12345u;
		if (kind < 7)
			p[i].size = 1 + (s >> 4) % 9000;
		else if (kind < 13)
			p[i].size = 9000 + (s >> 4) % 300000;
		else
			p[i].size = RAIL_MIN(quarter, (512u << 10) + (s >> 4) % quarter);
		s = s * 1103515245u + 12345u;
		p[i].off = ((size_t)(s >> 3) * 4099u) % (wsize - p[i].size + 1);
	}
}

static char seed_byte(int from, int round, int i, size_t b)
{
	return (char)(from * 29 + round * 13 + i * 5 + (b * 7 ^ b >> 9) + 1);
}

static unsigned seed_now;

static void seed_round(struct rank *r, int round, int to, size_t wsize)
{
	struct seed_put p[SEED_PUTS];
	size_t quarter = wsize / 4;
	void *req[4] = { 0 }, *sreq = NULL;
	int last_signals = (seed_now + (unsigned)round) % 2;

	seed_plan(seed_now, r->rank, round, wsize, p);
	for (int i = 0; i < SEED_PUTS && !r->fail[0]; i++) {
		char *src = r->src + (size_t)(i % 4) * quarter;
		int sig = last_signals && i == SEED_PUTS - 1;

		if (req[i % 4])
			ROK(r, wait_req(r, req[i % 4]));
		req[i % 4] = NULL;
		for (size_t b = 0; b < p[i].size; b++)
			src[b] = seed_byte(r->rank, round, i, b);
		if (sig)
			ROK(r, rma->iputSignal(r->rctx, 0, (size_t)(i % 4) * quarter, r->src_mh,
					       p[i].size, p[i].off, r->win_mh, (uint32_t)to,
					       (uint64_t)r->rank * 8, r->sig_mh, 1,
					       NCCL_NET_SIGNAL_OP_INC, true, &req[i % 4]));
		else
			ROK(r, rma->iput(r->rctx, 0, (size_t)(i % 4) * quarter, r->src_mh, p[i].size,
					 p[i].off, r->win_mh, (uint32_t)to, &req[i % 4]));
	}
	if (!last_signals)
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to,
				       (uint64_t)r->rank * 8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC,
				       true, &sreq));
	for (int k = 0; k < 4; k++)
		if (req[k])
			ROK(r, wait_req(r, req[k]));
	if (sreq)
		ROK(r, wait_req(r, sreq));
}

static void body_seeded(struct rank *r)
{
	struct grp *g = r->g;
	size_t wsize = (size_t)g->h.n * g->slot;
	int to = (r->rank + 1) % g->h.n, from = (r->rank + g->h.n - 1) % g->h.n;
	char *ref = calloc(1, wsize);
	struct seed_put p[SEED_PUTS];

	for (int round = 0; round < SEED_ROUNDS; round++) {
		seed_round(r, round, to, wsize);
		seed_plan(seed_now, from, round, wsize, p);
		for (int i = 0; i < SEED_PUTS; i++)
			for (size_t b = 0; b < p[i].size; b++)
				ref[p[i].off + b] = seed_byte(from, round, i, b);
		if (!r->fail[0] && wait_sig(r, from, (uint64_t)round + 1)) {
			for (size_t b = 0; b < wsize; b++) {
				if (r->win[b] != ref[b]) {
					RFAIL(r, "rank %d, round %d: byte %zu from rank %d is %d once "
					      "its signal came, the puts in order leave %d (RMA_SEED=%u)",
					      r->rank, round, b, from, r->win[b], ref[b], seed_now);
					break;
				}
			}
		}
		pthread_barrier_wait(&g->h.bar);	/* checked before the next round's puts */
	}
	free(ref);
}

static void test_lanes_seeded(void **state)
{
	const char *env = getenv("RMA_SEED");
	unsigned base = env ? (unsigned)strtoul(env, NULL, 0) : (unsigned)time(NULL);
	static const char *const lanes[] = { "4", "3", "1", "2" };
	int seeds = env ? 1 : 4;

	(void)state;
	for (int k = 0; k < seeds; k++) {
		seed_now = base + (unsigned)k;
		printf("lanes seed %u, NCCL_RAIL_RMA_LANES=%s (replay: RMA_SEED=%u)\n", seed_now,
		       lanes[k], seed_now);
		setenv("NCCL_RAIL_RMA_LANES", lanes[k], 1);
		if (k == 3) {	/* small socket buffers: lanes and streams back up */
			setenv("NCCL_SOCKET_SNDBUF", "32k", 1);
			setenv("NCCL_SOCKET_RCVBUF", "32k", 1);
		}
		unit_log_reset();
		run_group(k == 2 ? 3 : 2, 1, 1, 4u << 20, body_seeded);
		assert_true(rmah_striped_logged() > 0);
	}
	unsetenv("NCCL_RAIL_RMA_LANES");
	unsetenv("NCCL_SOCKET_SNDBUF");
	unsetenv("NCCL_SOCKET_RCVBUF");
}

/*
 * rankStride 2 on 4 ranks: rank r reaches r + 2 (and itself); r + 1 is not a
 * target of the context and is refused by name.
 */
static void body_stride(struct rank *r)
{
	struct grp *g = r->g;
	int to = (r->rank + 2) % g->h.n, from = (r->rank + 2) % g->h.n;
	void *req = NULL;

	memset(r->src, r->rank + 1, g->slot);
	ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, g->slot, (uint64_t)r->rank * g->slot,
			       r->win_mh, (uint32_t)to, (uint64_t)r->rank * 8, r->sig_mh, 1,
			       NCCL_NET_SIGNAL_OP_INC, true, &req));
	ROK(r, wait_req(r, req));
	RCHECK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh,
			    (uint32_t)(r->rank + 1) % 4, &req) != ncclSuccess, "%s",
	       "a put to a rank off the stride was accepted");
	if (wait_sig(r, from, 1))
		RCHECK(r, r->win[(size_t)from * g->slot + g->slot - 1] == from + 1, "%s",
		       "the bytes from rank + 2 are wrong");
}

static void test_stride(void **state)
{
	(void)state;
	unit_log_reset();
	run_group(4, 1, 2, 4096, body_stride);
	unit_assert_logged2(RAIL_LOG_WARN, "is not a target of this context", "rank stride 2");
}

/*
 * Ranges are checked against the peer's window: a put past its end, a
 * signal off the end or misaligned, a get from past its end, a source past
 * the local window, each refused with a WARN naming the call, the peer and
 * the window, and nothing sent (the group goes on working).
 */
static void body_bounds(struct rank *r)
{
	struct grp *g = r->g;
	size_t wsize = (size_t)g->h.n * g->slot;
	int to = (r->rank + 1) % g->h.n;
	void *req = NULL;

	RCHECK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 16, wsize - 8, r->win_mh, (uint32_t)to,
			    &req) != ncclSuccess, "%s", "a put past the peer's window passed");
	RCHECK(r, rma->iput(r->rctx, 0, wsize - 8, r->src_mh, 16, 0, r->win_mh, (uint32_t)to,
			    &req) != ncclSuccess, "%s", "a source past the window passed");
	RCHECK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 16, UINT64_MAX - 4, r->win_mh,
			    (uint32_t)to, &req) != ncclSuccess, "%s", "an offset that wraps passed");
	RCHECK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to,
				  (uint64_t)g->h.n * 8 + 8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true,
				  &req) != ncclSuccess, "%s", "a signal past the window passed");
	RCHECK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to, 4, r->sig_mh, 1,
				  NCCL_NET_SIGNAL_OP_INC, true, &req) != ncclSuccess, "%s",
	       "a misaligned signal passed");
	RCHECK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to, 0, r->sig_mh, 1,
				  3, true, &req) != ncclSuccess, "%s", "signal op 3 passed");
	RCHECK(r, rma->iget(r->rctx, 0, wsize, r->win_mh, 1, 0, r->src_mh, (uint32_t)to, &req) !=
	       ncclSuccess, "%s", "a get past the peer's window passed");
	RCHECK(r, rma->iput(r->rctx, 1, 0, r->src_mh, 8, 0, r->win_mh, (uint32_t)to, &req) !=
	       ncclSuccess, "%s", "context 1 of 1 passed");
	RCHECK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh, (uint32_t)g->h.n, &req) !=
	       ncclSuccess, "%s", "rank n passed");
	/* The group still works. */
	ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh, (uint32_t)to, 0,
			       r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true, &req));
	ROK(r, wait_req(r, req));
	wait_sig(r, 0, 1);
}

static void test_out_of_bounds_refused(void **state)
{
	(void)state;
	unit_log_reset();
	run_group(2, 1, 1, 4096, body_bounds);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput to rank 1 (", "remote range [8184, +16) is "
			    "outside window 1 (8192 bytes at the target)");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput to rank 0 (", "local range [8184, +16) is "
			    "outside window 0 (8192 bytes here)");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iputSignal to rank", "signal word [4, +8) is "
			    "misaligned in window 2");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iputSignal to rank", "signal word [24, +8) is "
			    "outside window 2 (24 bytes at the target)");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iputSignal", "signal op 3 is neither");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iget to rank", "remote range [8192, +1)");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput (rank", "context 1 of 1");
}

/*
 * GPU memory without a CUDA driver in the process (none is loaded here,
 * and NCCL_RAIL_CUDA_LIB is unset): every rank's regMrSym of NCCL_PTR_CUDA
 * fails at once (not after a timeout), naming the call, the type and what
 * is missing. test_rma_cuda serves it through the fake driver.
 */
static void body_cuda(struct rank *r)
{
	void *mh = NULL;
	uint64_t t0 = rmah_now_ns();

	RCHECK(r, rma->regMrSym(r->coll, r->win, 4096, NCCL_PTR_CUDA, 0, &mh) != ncclSuccess,
	       "%s", "NCCL_PTR_CUDA was registered");
	RCHECK(r, rmah_now_ns() - t0 < 5000000000ull, "%s", "the refusal took a timeout");
	/* The indices stay in step: the next registration works everywhere. */
	ROK(r, rma->regMrSym(r->coll, r->win, 4096, NCCL_PTR_HOST, 0, &mh));
	ROK(r, rma->deregMrSym(r->coll, mh));
}

static void test_cuda_refused(void **state)
{
	(void)state;
	unit_log_reset();
	run_group(2, 1, 1, 4096, body_cuda);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA regMrSym(", "(NCCL_PTR_CUDA) needs the CUDA "
			    "driver, and libcuda.so.1 is not loaded in this process");
}

/* Handles of another kind or already closed are refused with a WARN, never followed. */
static void test_bad_handles(void **state)
{
	void *ctx = NULL, *req = NULL;
	int done = 0;
	bool err = false;

	(void)state;
	unit_log_reset();
	assert_int_equal(rma->init(&ctx, 9, unit_log_sink), ncclSuccess);
	assert_int_not_equal(rma->test((void *)0x1234, (void *)0x5678, &done), ncclSuccess);
	assert_int_not_equal(rma->iput(ctx, 0, 0, NULL, 0, 0, NULL, 0, &req), ncclSuccess);
	assert_int_not_equal(rma->queryLastError((void *)0x99, &err), ncclSuccess);
	assert_int_not_equal(rma->closeColl(ctx), ncclSuccess);
	assert_int_equal(rma->finalize(ctx), ncclSuccess);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput", "is not a live RMA context");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA closeColl", "is not a live collComm");
}

/*
 * Ranks that arrive late, and contexts made back to back: rank r reaches
 * connect and each pair of createContext calls r x 60 ms after rank 0, so
 * a fast rank's links for the second context arrive while a slower one
 * still waits in the first (they wait for their call). Each context
 * carries a putSignal to the next rank; both go away before the next pair.
 */
static void body_more_contexts(struct rank *r)
{
	struct grp *g = r->g;
	ncclRmaConfig_v14_t cfg = { .nContexts = 2, .trafficClass = -1, .rankStride = 1 };
	int to = (r->rank + 1) % g->h.n, from = (r->rank + g->h.n - 1) % g->h.n;
	uint64_t want = 0;

	for (int k = 0; k < 3 && !r->fail[0]; k++) {
		void *x[2] = { NULL, NULL }, *req = NULL;

		usleep((useconds_t)(60 * r->rank) * 1000);
		ROK(r, rma->createContext(r->coll, &cfg, &x[0]));
		ROK(r, rma->createContext(r->coll, &cfg, &x[1]));
		for (int i = 0; i < 2 && !r->fail[0]; i++) {
			ROK(r, rma->iputSignal(x[i], i, 0, r->src_mh, 8, (uint64_t)r->rank * g->slot,
					       r->win_mh, (uint32_t)to, (uint64_t)r->rank * 8,
					       r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true, &req));
			ROK(r, wait_req(r, req));
			want++;
		}
		wait_sig(r, from, want);
		pthread_barrier_wait(&g->h.bar);
		for (int i = 0; i < 2; i++) {
			if (x[i])
				ROK(r, rma->destroyContext(x[i]));
		}
	}
}

static void test_late_ranks_and_more_contexts(void **state)
{
	(void)state;
	next_stagger_ms = 150;
	run_group(4, 1, 1, 4096, body_more_contexts);
	next_stagger_ms = 0;
	run_group(3, 1, 1, 4096, body_more_contexts);
}

/*
 * Out of descriptors (the soft RLIMIT_NOFILE at what is open now): connect
 * fails at once on every rank, with a WARN naming the limit, instead of
 * waiting NCCL_RAIL_CONNECT_TIMEOUT for links that cannot come.
 */
struct fdl {
	int rank;
	char handles[2][HSIZE];
	void *hptr[2];
	void *ctx, *lc, *coll;
	ncclResult_t res;
	uint64_t took_ns;
	pthread_barrier_t *bar;
};

static void *fdl_rank(void *arg)
{
	struct fdl *f = arg;
	uint64_t t0;

	pthread_barrier_wait(f->bar);	/* the limit is lowered */
	t0 = rmah_now_ns();
	f->res = rma->connect(NULL, f->hptr, 2, f->rank, f->lc, &f->coll);
	f->took_ns = rmah_now_ns() - t0;
	return NULL;
}

/* The lowest descriptor number free: a soft limit there lets no new one open. */
static int lowest_free_fd(void)
{
	char path[64];
	int fd = 0;

	for (;; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		if (access(path, F_OK))
			return fd;
	}
}

static void test_fd_limit_named(void **state)
{
	struct fdl f[2];
	pthread_barrier_t bar;
	pthread_t th[2];
	struct rlimit saved, low;

	(void)state;
	memset(f, 0, sizeof(f));
	pthread_barrier_init(&bar, NULL, 3);
	unit_log_reset();
	for (int i = 0; i < 2; i++) {
		f[i].rank = i;
		f[i].bar = &bar;
		assert_int_equal(rma->init(&f[i].ctx, 50 + (uint64_t)i, unit_log_sink), ncclSuccess);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(rma->listen(f[i].ctx, 0, f[0].handles[i], &f[i].lc), ncclSuccess);
		f[0].hptr[i] = f[1].hptr[i] = f[0].handles[i];
	}
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, fdl_rank, &f[i]), 0);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
	low = saved;
	low.rlim_cur = (rlim_t)lowest_free_fd();
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	pthread_barrier_wait(&bar);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
	pthread_barrier_destroy(&bar);
	for (int i = 0; i < 2; i++) {
		assert_int_not_equal(f[i].res, ncclSuccess);
		assert_true(f[i].took_ns < 5000000000ull);
		assert_int_equal(rma->closeListen(f[i].lc), ncclSuccess);
		assert_int_equal(rma->finalize(f[i].ctx), ncclSuccess);
	}
	unit_assert_logged2(RAIL_LOG_WARN, "RMA connect (rank", "RLIMIT_NOFILE soft limit");
}

/* ---- harness ----------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	rmah_tcp_env();
	rma = rmah_open(plugin, "ncclRmaPlugin_v14", &lib);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	return rmah_close(lib);
}

static int need_plugin(void **state)
{
	(void)state;
	rmah_need_plugin(lib, plugin);
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_exported, need_plugin),
		cmocka_unit_test_setup(test_off_declines, need_plugin),
		cmocka_unit_test_setup(test_devices_are_the_net_ones, need_plugin),
		cmocka_unit_test_setup(test_put_signal_get_2, need_plugin),
		cmocka_unit_test_setup(test_put_signal_get_4, need_plugin),
		cmocka_unit_test_setup(test_size0_null_handles, need_plugin),
		cmocka_unit_test_setup(test_ordering_under_load, need_plugin),
		cmocka_unit_test_setup(test_lanes_seeded, need_plugin),
		cmocka_unit_test_setup(test_stride, need_plugin),
		cmocka_unit_test_setup(test_out_of_bounds_refused, need_plugin),
		cmocka_unit_test_setup(test_cuda_refused, need_plugin),
		cmocka_unit_test_setup(test_bad_handles, need_plugin),
		cmocka_unit_test_setup(test_late_ranks_and_more_contexts, need_plugin),
		cmocka_unit_test_setup(test_fd_limit_named, need_plugin),
	};

	(void)argc;
	alarm(300);	/* a hung group fails the run instead of holding it */
	rmah_plugin_path(argv[0], plugin, sizeof(plugin));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
