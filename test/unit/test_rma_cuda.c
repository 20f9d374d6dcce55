/*
 * nccl-net-rail unit tests: one-sided RMA on GPU memory, through the
 * exported ncclRmaPlugin_v14 table, over the fake CUDA driver
 * (test/fakecuda/fakecuda.c, named to the plugin by NCCL_RAIL_CUDA_LIB).
 *
 * Ranks are threads of this process over loopback TCP, as in test_rma.c.
 * Each makes the fake's context current for init and registration (NCCL's
 * thread has its device current then) and drops it before its data
 * operations (NCCL's progress threads have none), so that every call the
 * plugin makes from a thread of its own or of NCCL works only if it set
 * the context itself: the fake refuses the others, and each test checks
 * that none was refused. Windows are the fake's device memory, which the
 * plugin cannot dereference (mapped PROT_NONE): the tests read and write
 * it through the fake's view.
 *
 * The ordering test draws its sizes and offsets from a seed it prints;
 * RMA_CUDA_SEED=N replays one.
 */
#include "unit.h"

#include <stdatomic.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fakecuda/fakecuda.h"
#include "rail.h"
#include "rma_harness.h"
#include "rma_v14.h"

static char plugin[PATH_MAX], fake_path[PATH_MAX];
static void *lib, *fake;
static ncclRma_v14_t *rma;
static fcu_alloc_device_fn fcu_alloc;
static fcu_host_fn fcu_host;
static fcu_make_current_fn fcu_current;
static fcu_set_delay_fn fcu_delay;
static fcu_hold_fn fcu_hold;
static fcu_hold_fn fcu_sms_busy;
static fcu_refuse_host_alloc_fn fcu_refuse_halloc;
static fcu_calls_fn fcu_calls;
static fcu_refused_fn fcu_refused;
static int (*fcu_set_ctx)(void *ctx);

#define MAXR 3
#define WAIT_NS (30ull * 1000000000ull)

struct rank;
typedef void (*body_fn)(struct rank *r);

struct grp {
	struct rmah_group h;	/* n, handles, hptr, bar */
	size_t slot;
	int host_only;		/* no GPU windows (the driver is missing) */
	body_fn body;
};

/* Device windows: src (what it puts), win (n slots peers put into), got (gets land), sig, vsig. */
struct rank {
	struct grp *g;
	int rank;
	void *ctx, *lc, *coll, *rctx;
	char *src, *win, *got;
	uint64_t *sig, *vsig;
	void *src_mh, *win_mh, *got_mh, *sig_mh, *vsig_mh;
	char fail[512];
};

/* The host's view of device memory. */
#define HV(p) ((char *)fcu_host(p))
#define HV64(p) ((uint64_t *)fcu_host(p))

static ncclResult_t wait_req(struct rank *r, void *req)
{
	ncclResult_t res;
	int done = rmah_test_until(rma->test, r->coll, req, WAIT_NS, 0, &res);

	RCHECK(r, res != ncclSuccess || done, "request %p not done in 30 s", req);
	return res;
}

/* A signal word in device memory, polled through the fake, reaches want. */
static int wait_word(struct rank *r, uint64_t *dword, uint64_t want, const char *what)
{
	uint64_t *w = HV64(dword);

	if (rmah_wait_word(w, want, WAIT_NS))
		return 1;
	RFAIL(r, "rank %d: %s is %llu, waited for %llu", r->rank, what, (unsigned long long)*w,
	      (unsigned long long)want);
	return 0;
}

static void reg(struct rank *r, void *p, size_t n, int flags, void **mh)
{
	ROK(r, rma->regMrSym(r->coll, p, n, r->g->host_only ? NCCL_PTR_HOST : NCCL_PTR_CUDA, flags,
			     mh));
}

static void rank_up(struct rank *r)
{
	struct grp *g = r->g;
	ncclRmaConfig_v14_t cfg = { .nContexts = 2, .trafficClass = -1, .rankStride = 1 };
	size_t wsize = (size_t)g->h.n * g->slot, ssize = ((size_t)g->h.n + 1) * 8;

	fcu_current();		/* NCCL's thread: its device is current */
	ROK(r, rma->init(&r->ctx, 0x2000 + (uint64_t)r->rank, unit_log_sink));
	ROK(r, rma->listen(r->ctx, 0, g->h.handles[r->rank], &r->lc));
	pthread_barrier_wait(&g->h.bar);
	ROK(r, rma->connect(NULL, g->h.hptr, g->h.n, r->rank, r->lc, &r->coll));
	ROK(r, rma->closeListen(r->lc));
	ROK(r, rma->createContext(r->coll, &cfg, &r->rctx));
	if (g->host_only)
		return;
	r->src = fcu_alloc(wsize);
	r->win = fcu_alloc(wsize);
	r->got = fcu_alloc(wsize);
	r->sig = fcu_alloc(ssize);
	r->vsig = fcu_alloc(ssize);
	reg(r, r->src, wsize, 0, &r->src_mh);
	reg(r, r->win, wsize, 0, &r->win_mh);
	reg(r, r->got, wsize, 0, &r->got_mh);
	reg(r, r->sig, ssize, NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET,
	    &r->sig_mh);
	reg(r, r->vsig, ssize, NCCL_NET_MR_FLAG_FORCE_SO, &r->vsig_mh);
}

static void rank_down(struct rank *r)
{
	pthread_barrier_wait(&r->g->h.bar);
	fcu_current();
	if (r->coll && !r->g->host_only) {
		ROK(r, rma->deregMrSym(r->coll, r->src_mh));
		ROK(r, rma->deregMrSym(r->coll, r->win_mh));
		ROK(r, rma->deregMrSym(r->coll, r->got_mh));
		ROK(r, rma->deregMrSym(r->coll, r->sig_mh));
		ROK(r, rma->deregMrSym(r->coll, r->vsig_mh));
	}
	if (r->coll) {
		ROK(r, rma->destroyContext(r->rctx));
		ROK(r, rma->closeColl(r->coll));
	}
	ROK(r, rma->finalize(r->ctx));
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;

	rank_up(r);
	pthread_barrier_wait(&r->g->h.bar);
	fcu_set_ctx(NULL);	/* NCCL's progress thread: no context */
	if (!r->fail[0])
		r->g->body(r);
	rank_down(r);
	return NULL;
}

static void run_group(int n, size_t slot, int host_only, body_fn body)
{
	struct grp g = { .slot = slot, .host_only = host_only, .body = body };
	struct rank rs[MAXR];
	unsigned long refused = fcu_refused();
	const char *fail;

	memset(rs, 0, sizeof(rs));
	for (int i = 0; i < n; i++) {
		rs[i].g = &g;
		rs[i].rank = i;
	}
	fail = RMAH_RUN(&g.h, n, rs, rank_main);
	if (fail) {
		unit_log_dump();
		fail_msg("%s", fail);
	}
	/* Every thread that called the driver had set the context first. */
	assert_int_equal(fcu_refused(), refused);
}

/* ---- the tests ------------------------------------------------------------- */

/*
 * Without the driver (NCCL_RAIL_CUDA_LIB names nothing loadable): a GPU
 * window is refused at once on every rank, naming the library; host
 * windows still work. Runs first: a loaded driver stays loaded.
 */
static void body_no_driver(struct rank *r)
{
	void *mh = NULL;
	char *host = calloc(1, 4096);

	fcu_current();
	RCHECK(r, rma->regMrSym(r->coll, host, 4096, NCCL_PTR_CUDA, 0, &mh) != ncclSuccess,
	       "%s", "GPU memory registered without a driver");
	ROK(r, rma->regMrSym(r->coll, host, 4096, NCCL_PTR_HOST, 0, &mh));
	ROK(r, rma->deregMrSym(r->coll, mh));
	free(host);
}

static void test_no_driver_named(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_CUDA_LIB", "/nonexistent/libcuda.so.1", 1);
	unit_log_reset();
	run_group(2, 4096, 1, body_no_driver);
	unit_assert_logged2(RAIL_LOG_WARN, "(NCCL_PTR_CUDA) needs the CUDA driver",
			    "NCCL_RAIL_CUDA_LIB=/nonexistent/libcuda.so.1 cannot be loaded");
	setenv("NCCL_RAIL_CUDA_LIB", fake_path, 1);
}

/*
 * Every rank puts a pattern into its slot of every rank's window, itself
 * included (a device-to-device copy), with a signal (INC from even ranks,
 * ADD 1000 + rank from odd ones) into the SIGNAL_NEVER_RESET window, then
 * a size-0 signal with NULL handles adds 7 into the other signal window,
 * whose word the target set to 5000 + sender beforehand (a shadow would
 * miss it: the plugin must read it back). Each target waits for both
 * signals in device memory and checks every byte; then every rank gets
 * every slot of every rank back into device memory and checks it.
 */
static void body_put_signal_get(struct rank *r)
{
	struct grp *g = r->g;
	void *req[MAXR], *sreq[MAXR];
	char *src = HV(r->src), *win = HV(r->win), *got = HV(r->got);

	for (int p = 0; p < g->h.n; p++) {
		HV64(r->vsig)[p] = 5000 + (uint64_t)p;
		for (size_t i = 0; i < g->slot; i++)
			src[(size_t)p * g->slot + i] = (char)rmah_pattern(r->rank, p, i);
	}
	pthread_barrier_wait(&g->h.bar);
	for (int p = 0; p < g->h.n; p++) {
		ROK(r, rma->iputSignal(r->rctx, 1, (uint64_t)p * g->slot, r->src_mh, g->slot,
				       (uint64_t)r->rank * g->slot, r->win_mh, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->sig_mh, 1000 + (uint64_t)r->rank,
				       r->rank % 2 ? NCCL_NET_SIGNAL_OP_ADD : NCCL_NET_SIGNAL_OP_INC,
				       true, &req[p]));
		ROK(r, rma->iputSignal(r->rctx, 1, 0, NULL, 0, 0, NULL, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->vsig_mh, 7, NCCL_NET_SIGNAL_OP_ADD,
				       true, &sreq[p]));
	}
	for (int p = 0; p < g->h.n; p++) {
		ROK(r, wait_req(r, req[p]));
		ROK(r, wait_req(r, sreq[p]));
	}
	for (int from = 0; from < g->h.n && !r->fail[0]; from++) {
		uint64_t want = from % 2 ? 1000 + (uint64_t)from : 1;

		if (!wait_word(r, &r->sig[from], want, "signal") ||
		    !wait_word(r, &r->vsig[from], 5007 + (uint64_t)from, "VA signal"))
			return;
		RCHECK(r, HV64(r->sig)[from] == want, "signal of %d is %llu", from,
		       (unsigned long long)HV64(r->sig)[from]);
		RCHECK(r, HV64(r->vsig)[from] == 5007 + (uint64_t)from, "VA signal of %d is %llu",
		       from, (unsigned long long)HV64(r->vsig)[from]);
		for (size_t i = 0; i < g->slot; i++) {
			if ((uint8_t)win[(size_t)from * g->slot + i] != rmah_pattern(from, r->rank, i)) {
				RFAIL(r, "rank %d: byte %zu from rank %d is wrong", r->rank, i, from);
				return;
			}
		}
	}
	pthread_barrier_wait(&g->h.bar);	/* every window is complete */
	for (int p = 0; p < g->h.n; p++) {
		ROK(r, rma->iget(r->rctx, 0, (uint64_t)((r->rank + 1) % g->h.n) * g->slot, r->win_mh,
				 g->slot, (uint64_t)p * g->slot, r->got_mh, (uint32_t)p, &req[p]));
	}
	for (int p = 0; p < g->h.n; p++) {
		int from = (r->rank + 1) % g->h.n;

		ROK(r, wait_req(r, req[p]));
		for (size_t i = 0; !r->fail[0] && i < g->slot; i++)
			RCHECK(r, (uint8_t)got[(size_t)p * g->slot + i] == rmah_pattern(from, p, i),
			       "byte %zu got from rank %d", i, p);
	}
}

static void test_put_signal_get(void **state)
{
	unsigned long w64 = fcu_calls("cuStreamWriteValue64_v2"), dtod = fcu_calls(
		"cuMemcpyDtoDAsync_v2"), htod = fcu_calls("cuMemcpyHtoDAsync_v2");

	(void)state;
	run_group(2, 100000, 0, body_put_signal_get);
	/* the first GPU window of the process: the fake's lazy module loading is named */
	unit_assert_logged2(RAIL_LOG_INFO, "CUDA loads modules lazily in this process",
			    "set CUDA_MODULE_LOADING=EAGER");
	run_group(3, 4099, 0, body_put_signal_get);
	/*
	 * It went through the driver: copies in, signals written on the stream;
	 * self copies through pinned memory, never DtoD (test_self_copy_needs_no_sms).
	 */
	assert_true(fcu_calls("cuStreamWriteValue64_v2") >= w64 + 2 * (4 + 9));
	assert_int_equal(fcu_calls("cuMemcpyDtoDAsync_v2"), dtod);
	assert_true(fcu_calls("cuMemcpyHtoDAsync_v2") > htod);
}

/*
 * Two peers' puts into one rank's GPU window at once, through small socket
 * buffers, so that the target's applier reads a piece of one stream, runs
 * dry, and turns to the other: each stream's bytes must land where they
 * belong (the readers of one applier share its staging ring). Ranks 1 and 2
 * put 3 MiB each into their own part of rank 0's window: in 24 KiB puts on
 * the stream (the main applier's ring), then in 768 KiB puts striped over 2
 * lanes (each lane's applier has a ring of its own, shared by the peers).
 */
static size_t share_put;

static void body_shared_ring(struct rank *r)
{
	size_t half = r->g->slot, n = half / share_put;
	void *req[4] = { 0 };

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank > 0) {
		char *src = HV(r->src);

		for (size_t b = 0; b < half; b++)
			src[b] = (char)(r->rank * 37 + b * 11 + (b >> 12));
		for (size_t i = 0; i < n && !r->fail[0]; i++) {
			if (req[i % 4])
				ROK(r, wait_req(r, req[i % 4]));
			ROK(r, rma->iput(r->rctx, 0, i * share_put, r->src_mh, share_put,
					 (size_t)(r->rank - 1) * half + i * share_put, r->win_mh, 0,
					 &req[i % 4]));
		}
		for (int k = 0; k < 4; k++)
			if (req[k])
				ROK(r, wait_req(r, req[k]));
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, 0, (uint64_t)r->rank * 8,
				       r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true, &req[0]));
		ROK(r, wait_req(r, req[0]));
		return;
	}
	for (int from = 1; from <= 2 && !r->fail[0]; from++) {
		const char *w = HV(r->win) + (size_t)(from - 1) * half;

		if (!wait_word(r, &r->sig[from], 1, "signal after the puts"))
			return;
		for (size_t b = 0; b < n * share_put; b++) {
			if (w[b] != (char)(from * 37 + b * 11 + (b >> 12))) {
				RFAIL(r, "byte %zu from rank %d is %d, it put %d", b, from, w[b],
				      (char)(from * 37 + b * 11 + (b >> 12)));
				return;
			}
		}
	}
}

static void test_two_peers_share_the_ring(void **state)
{
	(void)state;
	setenv("NCCL_SOCKET_SNDBUF", "16k", 1);
	setenv("NCCL_SOCKET_RCVBUF", "16k", 1);
	fcu_delay(20);
	for (int lanes = 0; lanes < 2; lanes++) {
		unsigned long striped = rmah_striped_logged();

		setenv("NCCL_RAIL_RMA_LANES", lanes ? "2" : "0", 1);
		share_put = lanes ? 768u << 10 : 24u << 10;
		run_group(3, 3u << 20, 0, body_shared_ring);
		assert_true(lanes ? rmah_striped_logged() > striped : 1);
	}
	fcu_delay(0);
	unsetenv("NCCL_RAIL_RMA_LANES");
	unsetenv("NCCL_SOCKET_SNDBUF");
	unsetenv("NCCL_SOCKET_RCVBUF");
}

/*
 * Ordering under load, with every copy of the fake delayed: many puts of
 * seeded random sizes at random offsets to the next rank (a fresh source
 * each time: written, put, waited for), some kept in flight together, then
 * a signal. Once the target sees the signal in device memory, every byte
 * of the window must be what the puts in order leave.
 */
#define LOAD_PUTS 120

struct load {
	size_t off[LOAD_PUTS], size[LOAD_PUTS];
};

static unsigned load_seed;

static void load_plan_to(struct load *l, int from, int to, size_t wsize)
{
	unsigned s = load_seed * 2654435761u + (unsigned)from * 97u + (unsigned)to * 7919u + 1;

	for (int i = 0; i < LOAD_PUTS; i++) {
		s = s * 1103515245u + 12345u;
		l->size[i] = 1 + (s >> 8) % (i % 5 ? 9000 : 300000);
		if (i % 9 == 4)	/* striped over the lanes: 512 KiB up to a source quarter */
			l->size[i] = RAIL_MIN(wsize / 4, (512u << 10) + (s >> 8) % (wsize / 4));
		s = s * 1103515245u + 12345u;
		l->off[i] = ((size_t)s >> 4) % (wsize - l->size[i] + 1);
	}
}

static void load_plan(struct load *l, int from, size_t wsize)
{
	load_plan_to(l, from, 0, wsize);
}

static char load_byte(int from, int i, size_t b)
{
	return (char)(from * 11 + i * 3 + b * 7 + 1);
}

static void body_load(struct rank *r)
{
	struct grp *g = r->g;
	size_t wsize = (size_t)g->h.n * g->slot;
	int to = (r->rank + 1) % g->h.n, from = (r->rank + g->h.n - 1) % g->h.n;
	char *ref = calloc(1, wsize), *win = HV(r->win), *src = HV(r->src);
	struct load *mine = calloc(1, sizeof(*mine)), *theirs = calloc(1, sizeof(*theirs));
	void *req[4] = { 0 }, *sreq = NULL;

	load_plan(mine, r->rank, wsize);
	for (int i = 0; i < LOAD_PUTS && !r->fail[0]; i++) {
		/* Four in flight, each from its own lane of the source, reused once it is done. */
		size_t lane = (size_t)(i % 4) * (wsize / 4);

		if (req[i % 4])
			ROK(r, wait_req(r, req[i % 4]));
		req[i % 4] = NULL;
		for (size_t b = 0; b < mine->size[i]; b++)
			src[lane + b] = load_byte(r->rank, i, b);
		ROK(r, rma->iput(r->rctx, 0, lane, r->src_mh, mine->size[i], mine->off[i],
				 r->win_mh, (uint32_t)to, &req[i % 4]));
	}
	ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)to,
			       (uint64_t)r->rank * 8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true,
			       &sreq));
	load_plan(theirs, from, wsize);
	for (int i = 0; i < LOAD_PUTS; i++)
		for (size_t b = 0; b < theirs->size[i]; b++)
			ref[theirs->off[i] + b] = load_byte(from, i, b);
	/* NCCL's proxy thread tests its requests meanwhile: their GPU bytes leave only then */
	for (uint64_t t0 = rmah_now_ns(); !r->fail[0] && !__atomic_load_n(HV64(&r->sig[from]),
	     __ATOMIC_ACQUIRE) && rmah_now_ns() - t0 < WAIT_NS;) {
		void **all[5] = { &req[0], &req[1], &req[2], &req[3], &sreq };

		for (int k = 0; k < 5; k++) {
			int done = 0;

			if (*all[k])
				ROK(r, rma->test(r->coll, *all[k], &done));
			if (done)
				*all[k] = NULL;
		}
	}
	if (wait_word(r, &r->sig[from], 1, "signal after the puts")) {
		for (size_t b = 0; b < wsize; b++) {
			if (win[b] != ref[b]) {
				RFAIL(r, "rank %d: byte %zu from rank %d is %d once its signal came, "
				      "the puts in order leave %d (seed %u)", r->rank, b, from, win[b],
				      ref[b], load_seed);
				break;
			}
		}
	}
	for (int k = 0; k < 4; k++)
		if (req[k])
			ROK(r, wait_req(r, req[k]));
	if (sreq)
		ROK(r, wait_req(r, sreq));
	free(ref);
	free(mine);
	free(theirs);
}

/*
 * The same to every rank at once, itself included: rank r puts its plan for
 * each rank into that rank's slot r, in turn, two puts in flight per rank,
 * then a signal to each; a target checks each sender's slot once its signal
 * came. Several peers' streams (and lanes) feed each target's appliers
 * together, and its own puts (through the pinned buffer, in pieces) share
 * the stream with what they land.
 */
#define ALL_INFLIGHT 2

static void body_load_all(struct rank *r)
{
	struct grp *g = r->g;
	int n = g->h.n;
	char *win = HV(r->win), *src = HV(r->src);
	struct load *plan = calloc((size_t)n, sizeof(*plan));
	void *req[RMAH_MAXR][ALL_INFLIGHT] = { { 0 } };
	char *ref = calloc(1, g->slot);

	for (int p = 0; p < n; p++)
		load_plan_to(&plan[p], r->rank, p, g->slot);
	for (int i = 0; i < LOAD_PUTS && !r->fail[0]; i++) {
		for (int p = 0; p < n && !r->fail[0]; p++) {
			/* each (peer, slot in flight) its own part of the source */
			size_t part = (size_t)(p * ALL_INFLIGHT + i % ALL_INFLIGHT) *
				      (g->h.n * g->slot / (RMAH_MAXR * ALL_INFLIGHT));
			void **q = &req[p][i % ALL_INFLIGHT];

			if (*q)
				ROK(r, wait_req(r, *q));
			*q = NULL;
			for (size_t b = 0; b < plan[p].size[i]; b++)
				src[part + b] = load_byte(r->rank, i, b);
			ROK(r, rma->iput(r->rctx, 0, part, r->src_mh, plan[p].size[i],
					 (size_t)r->rank * g->slot + plan[p].off[i], r->win_mh,
					 (uint32_t)p, q));
		}
	}
	for (int p = 0; p < n; p++) {
		for (int k = 0; k < ALL_INFLIGHT; k++)
			if (req[p][k])
				ROK(r, wait_req(r, req[p][k]));
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC,
				       true, &req[p][0]));
	}
	for (int from = 0; from < n && !r->fail[0]; from++) {
		struct load theirs;

		if (!wait_word(r, &r->sig[from], 1, "signal after the puts"))
			continue;
		load_plan_to(&theirs, from, r->rank, g->slot);
		memset(ref, 0, g->slot);
		for (int i = 0; i < LOAD_PUTS; i++)
			for (size_t b = 0; b < theirs.size[i]; b++)
				ref[theirs.off[i] + b] = load_byte(from, i, b);
		for (size_t b = 0; b < g->slot; b++) {
			if (win[(size_t)from * g->slot + b] != ref[b]) {
				RFAIL(r, "rank %d: byte %zu of rank %d's slot is %d once its signal came, "
				      "the puts in order leave %d (seed %u)", r->rank, b, from,
				      win[(size_t)from * g->slot + b], ref[b], load_seed);
				break;
			}
		}
	}
	for (int p = 0; p < n; p++)
		if (req[p][0])
			ROK(r, wait_req(r, req[p][0]));
	free(ref);
	free(plan);
}

/* "NAME N (mean X us": N and X, or 0 when the line has no such part. */
static int wait_figures(const char *line, const char *name, unsigned long *n, double *mean)
{
	const char *p = strstr(line, name);

	return p && sscanf(p + strlen(name), " %lu (mean %lf us", n, mean) == 2;
}

/*
 * Each rank's collComm logged at close how long it waited for the GPU, and
 * with every fake copy taking 30 us a put's source took at least that.
 */
static void check_waits_logged(int n)
{
	int lines = 0;

	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n; i++) {
		const char *t = unit_log_rec.lines[i].text;
		unsigned long k = 0;
		double mean = 0;

		if (!strstr(t, "waits for the GPU"))
			continue;
		lines++;
		if (!wait_figures(t, "put sources copied out", &k, &mean) || k == 0 || mean < 25.0 ||
		    !strstr(t, "signal words written") || strstr(t, " 0 signal words written")) {
			pthread_mutex_unlock(&unit_log_mu);
			fail_msg("wait figures missing or below the fake's 30 us copies: %s", t);
		}
	}
	pthread_mutex_unlock(&unit_log_mu);
	assert_int_equal(lines, n);
}

static void test_ordering_under_load(void **state)
{
	const char *env = getenv("RMA_CUDA_SEED");

	(void)state;
	load_seed = env ? (unsigned)strtoul(env, NULL, 0) : (unsigned)time(NULL);
	printf("ordering seed %u (replay: RMA_CUDA_SEED=%u)\n", load_seed, load_seed);
	fcu_delay(30);
	unit_log_reset();
	run_group(2, 4 << 20, 0, body_load);
	check_waits_logged(2);
	assert_true(rmah_striped_logged() > 0);
	run_group(3, 512 << 10, 0, body_load);
	run_group(3, 4 << 20, 0, body_load_all);	/* every rank to every other at once */
	fcu_delay(0);
}

/*
 * A GPU that does not run the plugin's copies is named (NCCL_RAIL_RMA_STALL_WARN=1,
 * every copy of the fake taking 3.5 s, so that the check, once a second,
 * meets the wait past 1 s even a second late): rank 0 gets 8 bytes of rank
 * 1's GPU window, so rank 1's applier waits for its copy out of the window
 * while rank 1's own thread only sleeps (the check has a thread of its
 * own); the wait is logged once, with the fake driver's lazy module loading
 * named, then its end, and the get still completes.
 */
static atomic_int stall_got;

static void body_gpu_stall(struct rank *r)
{
	void *req;

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 1) {
		while (!atomic_load(&stall_got))
			usleep(10000);
		return;
	}
	ROK(r, rma->iget(r->rctx, 0, 0, r->win_mh, 8, 0, r->got_mh, 1, &req));
	ROK(r, wait_req(r, req));
	atomic_store(&stall_got, 1);
}

static void test_gpu_stall_named(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_RMA_STALL_WARN", "1", 1);
	atomic_store(&stall_got, 0);
	fcu_delay(3500000);
	unit_log_reset();
	run_group(2, 4096, 0, body_gpu_stall);
	fcu_delay(0);
	unsetenv("NCCL_RAIL_RMA_STALL_WARN");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA on GPU memory (rank 1 of 2, device 0): a thread of "
			    "the plugin has been in cuStreamSynchronize for ", " s (8 bytes; no "
			    "signal word queued yet): the GPU has not run the copies and signal "
			    "writes queued on the stream, so every operation into this rank's GPU "
			    "windows waits; CUDA loads modules lazily in this process");
	unit_assert_logged2(RAIL_LOG_INFO, "RMA on GPU memory (rank 1 of 2, device 0): "
			    "cuStreamSynchronize returned after ", NULL);
	/* once per wait (rank 0 waits too: the reply's copy into its GPU window) */
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "(rank 1 of 2, device 0): a thread of the "
					"plugin has been in"), 1);
	if (unit_log_count(RAIL_LOG_WARN, "a thread of the plugin has been in") > 2) {
		unit_log_dump();
		fail_msg("a wait logged more than once");
	}
}

/*
 * A signal write the GPU does not run, with no thread waiting for it (a
 * GPU busy with the device API's kernels): rank 0 signals rank 1 (no
 * data, so that nothing waits for a copy), and the fake's streams hold.
 * Rank 1's check names it once (1 s limit), its signal word still unset;
 * once the streams go on, the end is logged and the signal lands.
 */
static const char queue_warn[] = "RMA on GPU memory (rank 1 of 2, device 0): the GPU has run none "
				 "of the plugin's signal writes for ";

static void body_queue_stall(struct rank *r)
{
	uint64_t t0 = rmah_now_ns();
	void *req;

	if (r->rank == 1)
		fcu_hold(1);
	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 0) {
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, 1, 0, r->sig_mh, 1,
				       NCCL_NET_SIGNAL_OP_INC, true, &req));
		ROK(r, wait_req(r, req));
		return;
	}
	while (!unit_log_count(RAIL_LOG_WARN, queue_warn) && rmah_now_ns() - t0 < WAIT_NS)
		usleep(20000);
	RCHECK(r, unit_log_count(RAIL_LOG_WARN, queue_warn) == 1, "%s", "no WARN in 30 s");
	/* not before the limit: the check counts from when it first saw the write queued */
	RCHECK(r, rmah_now_ns() - t0 >= 1000000000ull, "the WARN came after %.2f s, before the "
	       "1 s limit", (double)(rmah_now_ns() - t0) / 1e9);
	RCHECK(r, HV64(r->sig)[0] == 0, "the signal landed while held: %llu",
	       (unsigned long long)HV64(r->sig)[0]);
	fcu_hold(0);
	wait_word(r, &r->sig[0], 1, "signal");
	while (!unit_log_count(RAIL_LOG_INFO, "the GPU runs the plugin's signal writes again") &&
	       rmah_now_ns() - t0 < 2 * WAIT_NS)
		usleep(20000);
}

static void test_gpu_queue_stall_named(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_RMA_STALL_WARN", "1", 1);
	unit_log_reset();
	run_group(2, 4096, 0, body_queue_stall);
	fcu_hold(0);
	unsetenv("NCCL_RAIL_RMA_STALL_WARN");
	unit_assert_logged2(RAIL_LOG_WARN, queue_warn, " s (0 of 1 run; the last queued ");
	/* the time it names is the wait's (1-2 s), not the clock's since boot */
	assert_int_equal(unit_log_count2(RAIL_LOG_WARN, "signal writes for 1 s (", NULL) +
			 unit_log_count2(RAIL_LOG_WARN, "signal writes for 2 s (", NULL), 1);
	unit_assert_logged2(RAIL_LOG_WARN, queue_warn, "whatever waits for these signals (a device "
			    "API kernel, ncclWaitSignal) waits too; CUDA loads modules lazily");
	unit_assert_logged2(RAIL_LOG_INFO, "RMA on GPU memory (rank 1 of 2, device 0): the GPU "
			    "runs the plugin's signal writes again, after ", NULL);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "has run none of the plugin's signal"), 1);
}

/*
 * A driver that refuses the stall check's progress word (a write into
 * pinned host memory): each rank says so once, and every operation still
 * works (signals, data, gets).
 */
static void test_progress_refused(void **state)
{
	(void)state;
	setenv("FAKECUDA_NO_HOST_WRITE", "1", 1);
	unit_log_reset();
	run_group(2, 4096, 0, body_put_signal_get);
	unsetenv("FAKECUDA_NO_HOST_WRITE");
	assert_int_equal(unit_log_count2(RAIL_LOG_WARN, "cuStreamWriteValue64 into pinned host memory "
					 "for the stall check's progress word failed: ",
					 "nothing else changes"), 2);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "(rank 1 of 2, device 0): cuStreamWrite"), 1);
}

/*
 * NCCL's thread never waits for the GPU to copy a put's source out (the
 * GIN proxy thread serves every peer's puts: a wait there holds them all):
 * with every fake copy taking 300 ms, posting a put from a GPU window and
 * testing it return at once, not done; the put completes later, and its
 * bytes are there with its signal. The same for a put to the rank itself
 * (a copy within the GPU), whose bytes and signal are there once it is done.
 */
static void body_post_no_wait(struct rank *r)
{
	void *req = NULL;
	uint64_t t0;
	int done = 1;

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 0) {
		HV(r->src)[0] = 42;
		t0 = rmah_now_ns();
		ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh, 1, 0, r->sig_mh, 1,
				       NCCL_NET_SIGNAL_OP_INC, true, &req));
		ROK(r, rma->test(r->coll, req, &done));
		RCHECK(r, rmah_now_ns() - t0 < 150000000ull && !done, "posting and testing a put "
		       "out of GPU memory took %.0f ms (done %d): NCCL's thread waited for the copy",
		       (double)(rmah_now_ns() - t0) / 1e6, done);
		ROK(r, wait_req(r, req));
	}
	if (r->rank == 1) {	/* a put to itself: its copy and signal on the GPU, not waited for */
		HV(r->src)[0] = 43;
		t0 = rmah_now_ns();
		ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, 8, r->g->slot, r->win_mh, 1, 8,
				       r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true, &req));
		ROK(r, rma->test(r->coll, req, &done));
		RCHECK(r, rmah_now_ns() - t0 < 150000000ull && !done, "posting and testing a put to "
		       "this rank itself took %.0f ms (done %d): NCCL's thread waited for the GPU",
		       (double)(rmah_now_ns() - t0) / 1e6, done);
		ROK(r, wait_req(r, req));
		RCHECK(r, HV64(r->sig)[1] == 1 && HV(r->win)[r->g->slot] == 43, "the put to itself is "
		       "done, but its signal is %llu and its byte %d",
		       (unsigned long long)HV64(r->sig)[1], HV(r->win)[r->g->slot]);
	}
	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 1) {
		if (wait_word(r, &r->sig[0], 1, "signal after the put"))
			RCHECK(r, HV(r->win)[0] == 42, "byte 0 is %d", HV(r->win)[0]);
	}
}

static void test_post_does_not_wait(void **state)
{
	(void)state;
	fcu_delay(300000);
	run_group(2, 4096, 0, body_post_no_wait);
	fcu_delay(0);
}

/*
 * A put's source the GPU does not copy out (the fake's streams held, the
 * check at 1 s): rank 0's check names the copy, not the target, while its
 * thread keeps testing; once the streams go on, the put completes. Then a
 * put to rank 0 itself, whose copy within the GPU is held: named as well.
 */
#define COPY_WARN "the GPU has not run the plugin's copy of its source out of GPU memory"

static const char *stall_want;	/* the WARN body_source_stall waits for */
static int stall_to;		/* the rank its put goes to */

static void body_source_stall(struct rank *r)
{
	void *req = NULL;
	int done = 0;

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 0) {
		uint64_t t0 = rmah_now_ns();

		fcu_hold(1);
		ROK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 64, 0, r->win_mh, (uint32_t)stall_to,
				 &req));
		while (!r->fail[0] && !unit_log_count(RAIL_LOG_WARN, stall_want) &&
		       rmah_now_ns() - t0 < WAIT_NS) {
			ROK(r, rma->test(r->coll, req, &done));
			RCHECK(r, !done, "%s", "the put completed while the GPU held its copy");
			usleep(1000);
		}
		fcu_hold(0);
		ROK(r, wait_req(r, req));
	}
	pthread_barrier_wait(&r->g->h.bar);
}

static void test_source_copy_stall_named(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_RMA_STALL_WARN", "1", 1);
	unit_log_reset();
	stall_want = COPY_WARN;
	stall_to = 1;
	run_group(2, 4096, 0, body_source_stall);
	fcu_hold(0);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput to rank 1 (", COPY_WARN);
	unit_assert_logged2(RAIL_LOG_INFO, "(rank 0 of 2, device 0): context 0's stream to rank 1 ",
			    "moves again after ");
	/* a put to the rank itself, its GPU copy held: named too */
	stall_want = "RMA iput to this rank itself (context 0, rank 0 of 2, device 0): not done "
		     "after ";
	stall_to = 0;
	run_group(2, 4096, 0, body_source_stall);
	fcu_hold(0);
	unsetenv("NCCL_RAIL_RMA_STALL_WARN");
	unit_assert_logged2(RAIL_LOG_WARN, stall_want, "the GPU has not run its copy and signal");
}

/*
 * A put of one GPU window into another of the rank itself, larger than the
 * bounce buffer, while the SMs are held (the fake's copies within device
 * memory wait, as behind the device API's spinning kernels on a real GPU):
 * done with its bytes and signal all the same, since the plugin copies
 * through pinned host memory with the copy engines. With cuMemcpyDtoDAsync
 * the signal never came (GIN at 4 ranks on an H100).
 */
#define SELF_SLOT ((5u << 20) + 24)

static void body_self_sms_busy(struct rank *r)
{
	void *req = NULL;
	ncclResult_t res;
	int done;

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 1) {
		for (size_t i = 0; i < SELF_SLOT; i++)
			HV(r->src)[i] = (char)(i * 7 + 1);
		fcu_sms_busy(1);
		ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, SELF_SLOT, SELF_SLOT, r->win_mh, 1,
				       8, r->sig_mh, 1, NCCL_NET_SIGNAL_OP_INC, true, &req));
		done = rmah_test_until(rma->test, r->coll, req, 5000000000ull, 0, &res);
		fcu_sms_busy(0);
		RCHECK(r, res == ncclSuccess && done, "a put to this rank itself not done in 5 s "
		       "while the SMs were busy (result %d)", (int)res);
		if (res == ncclSuccess && !done)
			ROK(r, wait_req(r, req));
		RCHECK(r, HV64(r->sig)[1] == 1, "the signal of the put to itself is %llu",
		       (unsigned long long)HV64(r->sig)[1]);
		for (size_t i = 0; i < SELF_SLOT && !r->fail[0]; i++)
			RCHECK(r, HV(r->win)[SELF_SLOT + i] == (char)(i * 7 + 1), "byte %zu of the put "
			       "to itself is %d", i, HV(r->win)[SELF_SLOT + i]);
	}
	pthread_barrier_wait(&r->g->h.bar);
}

static void test_self_copy_needs_no_sms(void **state)
{
	(void)state;
	run_group(2, SELF_SLOT, 0, body_self_sms_busy);
	fcu_sms_busy(0);
}

/*
 * The pinned buffer of those copies cannot be allocated (the fake refuses
 * 4 MiB of pinned memory): the put to the rank itself fails, named as that
 * allocation; once memory is there again the next one works.
 */
#define BOUNCE_WARN "cuMemHostAlloc of the pinned buffer that copies between GPU windows of " \
		    "this rank pass through failed: "

static void body_self_bounce_refused(struct rank *r)
{
	void *req = NULL;
	ncclResult_t res;

	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 1) {
		HV(r->src)[0] = 9;
		fcu_refuse_halloc(4u << 20);
		res = rma->iputSignal(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh, 1, 8, r->sig_mh, 1,
				      NCCL_NET_SIGNAL_OP_INC, true, &req);
		if (res == ncclSuccess)
			rmah_test_until(rma->test, r->coll, req, WAIT_NS, 0, &res);
		fcu_refuse_halloc(0);
		RCHECK(r, res != ncclSuccess, "%s", "a put to itself succeeded without its buffer");
		RCHECK(r, unit_log_count(RAIL_LOG_WARN, BOUNCE_WARN) == 1, "%s",
		       "the refused allocation is not named once");
		ROK(r, rma->iputSignal(r->rctx, 0, 0, r->src_mh, 8, 0, r->win_mh, 1, 8, r->sig_mh, 1,
				       NCCL_NET_SIGNAL_OP_INC, true, &req));
		ROK(r, wait_req(r, req));
		RCHECK(r, HV(r->win)[0] == 9 && HV64(r->sig)[1] == 1, "after the refusal: byte %d, "
		       "signal %llu", HV(r->win)[0], (unsigned long long)HV64(r->sig)[1]);
	}
	pthread_barrier_wait(&r->g->h.bar);
}

static void test_self_bounce_refused_named(void **state)
{
	(void)state;
	unit_log_reset();
	run_group(2, 4096, 0, body_self_bounce_refused);
	fcu_refuse_halloc(0);
}

/* The fake itself refuses a call on a thread with no context (what the tests rely on). */
static void test_fake_refuses_without_context(void **state)
{
	int (*create)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(fake,
										"cuStreamCreate");
	unsigned long before = fcu_refused();
	void *s = NULL;

	(void)state;
	fcu_set_ctx(NULL);
	assert_non_null(create);
	assert_int_equal(create(&s, 1), 201);	/* CUDA_ERROR_INVALID_CONTEXT */
	assert_int_equal(fcu_refused(), before + 1);
}

/* ---- harness ----------------------------------------------------------------- */

#define FCU(sym, var) (*(void **)&(var) = dlsym(fake, sym))

static int group_setup(void **state)
{
	(void)state;
	rmah_tcp_env();
	setenv("NCCL_RAIL_CUDA_LIB", fake_path, 1);
	fake = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
	if (fake && FCU("fcu_test_alloc_device", fcu_alloc) && FCU("fcu_test_host", fcu_host) &&
	    FCU("fcu_test_make_current", fcu_current) && FCU("fcu_test_set_delay_us", fcu_delay) &&
	    FCU("fcu_test_hold", fcu_hold) && FCU("fcu_test_sms_busy", fcu_sms_busy) &&
	    FCU("fcu_test_refuse_host_alloc", fcu_refuse_halloc) &&
	    FCU("fcu_test_calls", fcu_calls) && FCU("fcu_test_refused", fcu_refused) &&
	    FCU("cuCtxSetCurrent", fcu_set_ctx))
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
	if (!lib || !rma) {
		printf("SKIP: %s or the fake driver %s not loadable: run make plugin tests\n",
		       plugin, fake_path);
		skip();
	}
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_no_driver_named, need_plugin),
		cmocka_unit_test_setup(test_fake_refuses_without_context, need_plugin),
		cmocka_unit_test_setup(test_put_signal_get, need_plugin),
		cmocka_unit_test_setup(test_two_peers_share_the_ring, need_plugin),
		cmocka_unit_test_setup(test_ordering_under_load, need_plugin),
		cmocka_unit_test_setup(test_gpu_stall_named, need_plugin),
		cmocka_unit_test_setup(test_gpu_queue_stall_named, need_plugin),
		cmocka_unit_test_setup(test_progress_refused, need_plugin),
		cmocka_unit_test_setup(test_post_does_not_wait, need_plugin),
		cmocka_unit_test_setup(test_source_copy_stall_named, need_plugin),
		cmocka_unit_test_setup(test_self_copy_needs_no_sms, need_plugin),
		cmocka_unit_test_setup(test_self_bounce_refused_named, need_plugin),
	};

	(void)argc;
	alarm(300);
	rmah_plugin_path(argv[0], plugin, sizeof(plugin));
	rmah_fake_cuda_path(argv[0], fake_path, sizeof(fake_path));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
