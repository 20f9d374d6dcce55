/*
 * nccl-net-rail unit tests: the verbs RMA backend (src/rma/rma_ib*.c)
 * through the exported table, on the fake verbs provider or, with
 * RMA_IB_LIVE=1, on the machine's libibverbs and RDMA devices (Soft-RoCE in
 * the rxe guest: test/rxe/tests.d/18-ib-rma.sh).
 *
 * The built plugin is loaded with dlopen and ncclRmaPlugin_v14 looked up,
 * as NCCL does; NCCL_RAIL_TRANSPORT=ib and NCCL_IBVERBS_LIB name the fake
 * (RAIL_FAKEVERBS_LIB, else build/test/fakeverbs/libfakeverbs.so), so the
 * ranks, threads of this process, reach each other through the fake's RC
 * QPs (puts, FETCH_AND_ADD signals, reads) and the TCP mesh on loopback.
 * RMA_IB_SEED=N replays one seed of the random mix.
 *
 * Live (RMA_IB_LIVE=1): no fake description, NCCL_IBVERBS_LIB left as the
 * caller has it (unset: the system's libibverbs), host memory; rank r
 * listens on device r % ndev (rxe0, rxe1, rxe0, ...: puts to itself and
 * between devices). declines_without_atomics skips (it needs the fake's
 * atomic=no device); signal_after_puts runs without the fake's reordering,
 * checking the device's own order of writes before an atomic; the random
 * mix runs one seed of 3 ranks, MIX_OPS_LIVE operations each. Without an
 * RDMA device every test skips, saying so, unless RAIL_TEST_REQUIRE_RDMA=1
 * (the rxe guest sets it) makes that a failure, as in test_ib_live.
 */
#include "unit.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ib/ib_verbs.h"
#include "param.h"
#include "rail.h"
#include "rma/rma.h"
#include "rma_harness.h"
#include "rma_v14.h"
#include "../fakecuda/fakecuda.h"

static char plugin[PATH_MAX], fakelib[PATH_MAX], tmpdir[64], confpath[128];
static void *lib;
static ncclRma_v14_t *rma;
static int live;		/* RMA_IB_LIVE=1: the machine's verbs, not the fake */
static uint64_t wait_ns = 20ull * 1000000000ull;	/* 60 s live */
static char fakecuda[PATH_MAX];	/* the fake CUDA driver: GPU windows (not live) */
static void *fcu;
static fcu_alloc_device_fn fcu_alloc;
static fcu_host_fn fcu_host;
static fcu_dmabuf_fn fcu_dmabuf;

#define MAXR RMAH_MAXR
#define MAXC 2

static const char roce[] = "device mlx5_0\nport 1 link=eth\ngid 1 ::ffff:10.1.0.1 type=v2\n";
static const char roce_reorder[] = "device mlx5_0 reorder=yes reorder_delay=50\n"
				   "port 1 link=eth\ngid 1 ::ffff:10.1.0.1 type=v2\n";
static const char roce_nodmabuf[] = "device mlx5_0 dmabuf=no\n"
				    "port 1 link=eth\ngid 1 ::ffff:10.1.0.1 type=v2\n";
static const char roce_noatomic[] = "device mlx5_0 atomic=no\n"
				    "port 1 link=eth\ngid 1 ::ffff:10.1.0.1 type=v2\n";

/*
 * A group of n ranks (threads), nctx contexts each, and five symmetric
 * windows: src (what a rank puts), win (n slots: what rank q puts lands in
 * slot q), sig (n * MAXC + 1 signal words), fixed (a pattern of the
 * rank's, never written: what gets read), got (where gets land).
 */
struct rank;
typedef void (*body_fn)(struct rank *r);

struct grp {
	struct rmah_group h;	/* n, handles, hptr, bar */
	int nctx;
	size_t slot;
	uint64_t seed;
	body_fn body;
};

struct rank {
	struct grp *g;
	int rank;
	void *ctx, *lc, *coll, *rctx;
	char *src, *win, *fixed, *got;
	uint64_t *sig;
	void *src_mh, *win_mh, *sig_mh, *fixed_mh, *got_mh;
	int win_gone;		/* a test deregistered it early */
	char fail[512];
};

static ncclResult_t wait_req(struct rank *r, void *req)
{
	ncclResult_t res;
	int done = rmah_test_until(rma->test, r->coll, req, wait_ns, 1, &res);

	RCHECK(r, res != ncclSuccess || done, "request %p not done in %llu s", req,
	       (unsigned long long)(wait_ns / 1000000000ull));
	return res;
}

static int wait_sig(struct rank *r, int word, uint64_t want)
{
	if (rmah_wait_word(&r->sig[word], want, wait_ns))
		return 1;
	RFAIL(r, "rank %d: signal word %d is %llu, waited for %llu", r->rank, word,
	      (unsigned long long)r->sig[word], (unsigned long long)want);
	return 0;
}

static void reg(struct rank *r, void *p, size_t n, int flags, void **mh)
{
	ROK(r, rma->regMrSym(r->coll, p, n, NCCL_PTR_HOST, flags, mh));
}

static void rank_up(struct rank *r)
{
	struct grp *g = r->g;
	ncclRmaConfig_v14_t cfg = { .nContexts = g->nctx, .trafficClass = -1, .rankStride = 1 };
	size_t wsize = (size_t)g->h.n * g->slot;
	int ndev = 0;

	ROK(r, rma->init(&r->ctx, 0x2000 + (uint64_t)r->rank, unit_log_sink));
	ROK(r, rma->devices(&ndev));
	RCHECK(r, ndev > 0, "rank %d: no device", r->rank);
	ROK(r, rma->listen(r->ctx, ndev > 0 ? r->rank % ndev : 0, g->h.handles[r->rank], &r->lc));
	pthread_barrier_wait(&g->h.bar);		/* NCCL's allgather of the handles */
	ROK(r, rma->connect(NULL, g->h.hptr, g->h.n, r->rank, r->lc, &r->coll));
	ROK(r, rma->closeListen(r->lc));
	ROK(r, rma->createContext(r->coll, &cfg, &r->rctx));
	r->src = calloc(1, wsize);
	r->win = calloc(1, wsize);
	r->fixed = calloc(1, wsize);
	r->got = calloc(1, wsize);
	r->sig = calloc((size_t)g->h.n * MAXC + 1, 8);
	for (size_t i = 0; i < wsize; i++)
		r->fixed[i] = (char)rmah_pattern(r->rank, 99, i);
	reg(r, r->src, wsize, 0, &r->src_mh);
	reg(r, r->win, wsize, 0, &r->win_mh);
	reg(r, r->sig, ((size_t)g->h.n * MAXC + 1) * 8,
	    NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, &r->sig_mh);
	reg(r, r->fixed, wsize, 0, &r->fixed_mh);
	reg(r, r->got, wsize, 0, &r->got_mh);
}

static void rank_down(struct rank *r)
{
	pthread_barrier_wait(&r->g->h.bar);	/* nobody puts into what is going away */
	if (r->coll) {
		if (!r->win_gone)
			ROK(r, rma->deregMrSym(r->coll, r->win_mh));
		ROK(r, rma->deregMrSym(r->coll, r->src_mh));
		ROK(r, rma->deregMrSym(r->coll, r->sig_mh));
		ROK(r, rma->deregMrSym(r->coll, r->fixed_mh));
		ROK(r, rma->deregMrSym(r->coll, r->got_mh));
		ROK(r, rma->destroyContext(r->rctx));
		ROK(r, rma->closeColl(r->coll));
	}
	ROK(r, rma->finalize(r->ctx));
	free(r->src);
	free(r->win);
	free(r->fixed);
	free(r->got);
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

/* The fake's device description (live: the machine's devices, nothing to write). */
static void write_conf(const char *text)
{
	FILE *f;

	if (live)
		return;
	f = fopen(confpath, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void run_group_seed(const char *conf, int n, int nctx, size_t slot, uint64_t seed,
			   body_fn body)
{
	struct grp g = { .nctx = nctx, .slot = slot, .body = body, .seed = seed };
	struct rank rs[MAXR];
	const char *fail;

	write_conf(conf);
	unit_log_reset();
	memset(rs, 0, sizeof(rs));
	for (int i = 0; i < n; i++) {
		rs[i].g = &g;
		rs[i].rank = i;
	}
	fail = RMAH_RUN(&g.h, n, rs, rank_main);
	if (fail) {
		unit_log_dump();
		fail_msg("%s (seed %llu)", fail, (unsigned long long)seed);
	}
}

static void run_group(const char *conf, int n, int nctx, size_t slot, body_fn body)
{
	run_group_seed(conf, n, nctx, slot, 0, body);
}


/* ---- the tests ------------------------------------------------------------- */

static void put_all(struct rank *r, int ctx, int signal, void **req)
{
	struct grp *g = r->g;

	for (int p = 0; p < g->h.n; p++) {
		if (signal)
			ROK(r, rma->iputSignal(r->rctx, ctx, (uint64_t)p * g->slot, r->src_mh, g->slot,
					       (uint64_t)r->rank * g->slot, r->win_mh, (uint32_t)p,
					       (uint64_t)(r->rank * MAXC + ctx) * 8, r->sig_mh,
					       1000 + (uint64_t)r->rank, r->rank % 2
					       ? NCCL_NET_SIGNAL_OP_ADD : NCCL_NET_SIGNAL_OP_INC,
					       true, &req[p]));
		else
			ROK(r, rma->iput(r->rctx, ctx, (uint64_t)p * g->slot, r->src_mh, g->slot,
					 (uint64_t)r->rank * g->slot, r->win_mh, (uint32_t)p, &req[p]));
		RCHECK(r, req[p] != NULL, "no request for rank %d", p);
	}
	for (int p = 0; p < g->h.n; p++)
		ROK(r, wait_req(r, req[p]));
}

static int slots_are(struct rank *r, uint8_t x)
{
	struct grp *g = r->g;

	for (int q = 0; q < g->h.n; q++)
		for (size_t i = 0; i < g->slot; i++)
			if ((uint8_t)r->win[(size_t)q * g->slot + i] != (rmah_pattern(q, r->rank, i) ^ x)) {
				RFAIL(r, "rank %d: byte %zu from rank %d is wrong", r->rank, i, q);
				return 0;
			}
	return 1;
}

/*
 * Plain puts to every rank, itself included, checked after a barrier; then
 * puts with a signal (INC from even ranks, ADD 1000 + rank from odd ones)
 * on the last context, each slot checked once its signal is seen; then gets
 * of every rank's fixed window, and a flush.
 */
static void body_put_signal_get(struct rank *r)
{
	struct grp *g = r->g;
	void *req[MAXR];
	int ctx = g->nctx - 1;
	size_t wsize = (size_t)g->h.n * g->slot;

	for (int p = 0; p < g->h.n; p++)
		for (size_t i = 0; i < g->slot; i++)
			r->src[(size_t)p * g->slot + i] = (char)(rmah_pattern(r->rank, p, i) ^ 0x5a);
	put_all(r, 0, 0, req);
	pthread_barrier_wait(&g->h.bar);
	if (!slots_are(r, 0x5a))
		return;
	pthread_barrier_wait(&g->h.bar);
	for (int p = 0; p < g->h.n; p++)
		for (size_t i = 0; i < g->slot; i++)
			r->src[(size_t)p * g->slot + i] = (char)rmah_pattern(r->rank, p, i);
	put_all(r, ctx, 1, req);
	for (int q = 0; q < g->h.n; q++) {
		uint64_t want = q % 2 ? 1000 + (uint64_t)q : 1;

		if (!wait_sig(r, q * MAXC + ctx, want))
			return;
		RCHECK(r, r->sig[q * MAXC + ctx] == want, "signal of rank %d is %llu", q,
		       (unsigned long long)r->sig[q * MAXC + ctx]);
	}
	if (!slots_are(r, 0))
		return;
	for (int p = 0; p < g->h.n; p++) {
		void *rq = NULL;

		memset(r->got, 0, wsize);
		ROK(r, rma->iget(r->rctx, 0, 0, r->fixed_mh, wsize, 0, r->got_mh, (uint32_t)p, &rq));
		RCHECK(r, rq != NULL, "iget from rank %d gave no request", p);
		ROK(r, wait_req(r, rq));
		for (size_t i = 0; i < wsize && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)r->got[i] == rmah_pattern(p, 99, i), "iget from rank %d: byte "
			       "%zu", p, i);
	}
	req[0] = (void *)1;
	ROK(r, rma->iflush(r->rctx, 0, r->sig_mh, (uint32_t)r->rank, &req[0]));
	if (req[0])
		ROK(r, wait_req(r, req[0]));
}

static void test_put_signal_get_2(void **state)
{
	(void)state;
	run_group(roce, 2, 2, 4096, body_put_signal_get);
	unit_assert_logged2(RAIL_LOG_INFO, "RMA (ABI v14): served by the ib backend",
			    "FETCH_AND_ADD");
}

static void test_put_signal_get_4(void **state)
{
	(void)state;
	run_group(roce, 4, 1, 1000, body_put_signal_get);
}

/* A signal alone (size 0, NULL handles): only the word changes, by the value added. */
static void body_size0(struct rank *r)
{
	struct grp *g = r->g;
	void *req[MAXR];

	for (int p = 0; p < g->h.n; p++)
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)p,
				       (uint64_t)r->rank * MAXC * 8, r->sig_mh, 5 + (uint64_t)r->rank,
				       NCCL_NET_SIGNAL_OP_ADD, true, &req[p]));
	for (int p = 0; p < g->h.n; p++)
		ROK(r, wait_req(r, req[p]));
	for (int q = 0; q < g->h.n; q++)
		if (wait_sig(r, q * MAXC, 5 + (uint64_t)q))
			RCHECK(r, r->sig[q * MAXC] == 5 + (uint64_t)q, "signal of rank %d: %llu", q,
			       (unsigned long long)r->sig[q * MAXC]);
	for (size_t i = 0; i < (size_t)g->h.n * g->slot; i++)
		RCHECK(r, r->win[i] == 0, "byte %zu of the window was written", i);
}

static void test_size0_signal(void **state)
{
	(void)state;
	run_group(roce, 3, 1, 256, body_size0);
}

/*
 * Ordering on a device that places the bulk of every write late (the fake's
 * reorder, held for 50 entries into the provider; live, the device's own
 * order, rank 0 on rxe0 and rank 1 on rxe1 in the guest): rank 0 posts 32
 * puts and then a signal alone to rank 1 and tests nothing until rank 1,
 * which checks every byte the moment it sees the signal, is done. Only a signal executed after
 * every earlier write of its QP passes.
 */
#define ORD_PUTS 32

static void body_ordering(struct rank *r)
{
	struct grp *g = r->g;
	size_t chunk = g->slot / ORD_PUTS;
	void *req[ORD_PUTS + 1];

	if (r->rank == 0) {
		for (size_t i = 0; i < g->slot; i++)
			r->src[i] = (char)rmah_pattern(0, 1, i);
		for (int k = 0; k < ORD_PUTS; k++)
			ROK(r, rma->iput(r->rctx, 0, (uint64_t)k * chunk, r->src_mh, chunk,
					 (uint64_t)k * chunk, r->win_mh, 1, &req[k]));
		ROK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, 1, 0, r->sig_mh, 0,
				       NCCL_NET_SIGNAL_OP_INC, true, &req[ORD_PUTS]));
	} else if (r->rank == 1 && wait_sig(r, 0, 1)) {
		for (size_t i = 0; i < g->slot && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)r->win[i] == rmah_pattern(0, 1, i), "byte %zu not there when "
			       "the signal was seen", i);
	}
	pthread_barrier_wait(&g->h.bar);
	for (int k = 0; r->rank == 0 && k <= ORD_PUTS; k++)
		ROK(r, wait_req(r, req[k]));
}

static void test_signal_after_puts(void **state)
{
	(void)state;
	run_group(roce_reorder, 2, 1, ORD_PUTS * 512, body_ordering);
}

/*
 * Errors, named: a put past the end of the peer's window is refused before
 * anything is posted; a put into a window its peer already deregistered
 * fails at test with the completion named, and queryLastError says so.
 */
static void body_errors(struct rank *r)
{
	struct grp *g = r->g;
	size_t wsize = (size_t)g->h.n * g->slot;
	void *req = NULL;
	bool has = false;

	if (r->rank == 0) {
		RCHECK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 64, wsize - 8, r->win_mh, 1, &req) !=
		       ncclSuccess, "a put past the window was accepted");
		RCHECK(r, rma->iputSignal(r->rctx, 0, 0, NULL, 0, 0, NULL, 1, 4, r->sig_mh, 1,
					  NCCL_NET_SIGNAL_OP_INC, true, &req) != ncclSuccess,
		       "a misaligned signal word was accepted");
		ROK(r, rma->queryLastError(r->rctx, &has));
		RCHECK(r, !has, "an error before anything failed");
	}
	if (r->rank == 1) {
		ROK(r, rma->deregMrSym(r->coll, r->win_mh));
		r->win_gone = 1;
	}
	pthread_barrier_wait(&g->h.bar);
	if (r->rank == 0) {
		ROK(r, rma->iput(r->rctx, 0, 0, r->src_mh, 64, 0, r->win_mh, 1, &req));
		RCHECK(r, wait_req(r, req) != ncclSuccess, "a put into a deregistered window passed");
		ROK(r, rma->queryLastError(r->rctx, &has));
		RCHECK(r, has, "queryLastError did not report the failed put");
	}
}

static void test_errors_named(void **state)
{
	(void)state;
	run_group(roce, 2, 1, 256, body_errors);
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iput (rank 0, context 0) to rank 1: the remote "
			    "range", "outside window #1 of rank 1");
	unit_assert_logged2(RAIL_LOG_WARN, "RMA iputSignal (rank 0", "not 8-byte aligned");
	unit_assert_logged2(RAIL_LOG_WARN, "completion error on qp", "refused the key or range");
}

/* A device without atomics: init declines, naming it, and NCCL uses its own backend. */
/*
 * By default the verbs backend is not offered (it refuses GPU memory, which
 * NCCL registers): the core's choice, asked directly (the plugin under test
 * read its parameters once, with NCCL_RAIL_RMA_IB=1 set by main).
 */
static void test_declines_by_default(void **state)
{
	char why[400];

	(void)state;
	unsetenv("NCCL_RAIL_RMA_IB");
	rail_params_reload();
	assert_null(rail_rma_backend("ib", why, sizeof(why)));
	assert_non_null(strstr(why, "NCCL_RAIL_RMA_IB=1"));
	assert_non_null(strstr(why, "NCCL's own backend"));
	setenv("NCCL_RAIL_RMA_IB", "1", 1);
	rail_params_reload();
	rail_rma_backend("ib", why, sizeof(why));
	assert_null(strstr(why, "NCCL_RAIL_RMA_IB=1"));
	assert_non_null(rail_rma_backend("tcp", why, sizeof(why)));
}

static void test_declines_without_atomics(void **state)
{
	void *ctx = NULL;

	(void)state;
	if (live) {
		print_message("skipping live: it needs the fake provider's device without atomics "
			      "(atomic=no); the devices here are what they are\n");
		skip();
	}
	write_conf(roce_noatomic);
	unit_log_reset();
	assert_int_not_equal(rma->init(&ctx, 1, unit_log_sink), ncclSuccess);
	assert_null(ctx);
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0 cannot do atomics", "NCCL's own backend");
	assert_int_equal(rma->finalize(NULL), ncclSuccess);
}

/*
 * A seeded random mix: every rank posts MIX_OPS puts, puts with a signal
 * (ADD), signals alone and gets, to random ranks (itself included) on
 * random contexts, up to MIX_FLIGHT at once (each with its own staging
 * chunk of src or got). Rank s writes only its own region of a target's
 * window for context c, so per (context, peer) program order decides every
 * byte: each rank keeps the model of what it wrote and of what it added,
 * and after the last completion and a barrier every target checks every
 * byte of its window and every signal word against the models. Each get is
 * checked against the target's fixed pattern when it completes.
 */
#define MIX_OPS 400
#define MIX_OPS_LIVE 200	/* Soft-RoCE under emulation is slow */
#define MIX_FLIGHT 4	/* chunks of a region: they fit src and got with 2 ranks */

struct mix {
	uint8_t *model[MAXR][MAXR][MAXC];	/* [source][target][context] */
	uint64_t sum[MAXR][MAXR][MAXC];
};
static struct mix mixm;

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

struct mix_op {
	void *req;
	int get, peer;
	uint64_t off, len;
};

static void mix_done(struct rank *r, struct mix_op *o, size_t chunk, int k)
{
	if (!o->req)
		return;
	ROK(r, wait_req(r, o->req));
	for (uint64_t i = 0; o->get && i < o->len && !r->fail[0]; i++)
		RCHECK(r, (uint8_t)r->got[(size_t)k * chunk + i] == rmah_pattern(o->peer, 99, o->off + i),
		       "iget from rank %d at %llu: byte %llu", o->peer,
		       (unsigned long long)o->off, (unsigned long long)i);
	o->req = NULL;
}

static void mix_post(struct rank *r, uint64_t *s, struct mix_op *o, size_t chunk, int k)
{
	struct grp *g = r->g;
	size_t region = g->slot / MAXC;
	int p = (int)(rnd(s) % (uint64_t)g->h.n), c = (int)(rnd(s) % (uint64_t)g->nctx);
	int kind = (int)(rnd(s) % 4);
	uint64_t len = 1 + rnd(s) % region, off = rnd(s) % (region - len + 1);
	uint64_t dst = (uint64_t)r->rank * g->slot + (uint64_t)c * region + off, add = 0;
	uint8_t *m = mixm.model[r->rank][p][c];

	*o = (struct mix_op){ .peer = p, .get = kind == 2, .off = dst, .len = len };
	for (uint64_t i = 0; kind < 2 && i < len; i++)
		m[off + i] = (uint8_t)(r->src[(size_t)k * chunk + i] = (char)rnd(s));
	if (kind == 1 || kind == 3)
		mixm.sum[r->rank][p][c] += add = 1 + rnd(s) % 1000;
	if (kind == 0)
		ROK(r, rma->iput(r->rctx, c, (uint64_t)k * chunk, r->src_mh, len, dst, r->win_mh,
				 (uint32_t)p, &o->req));
	else if (kind == 2)
		ROK(r, rma->iget(r->rctx, c, dst, r->fixed_mh, len, (uint64_t)k * chunk, r->got_mh,
				 (uint32_t)p, &o->req));
	else
		ROK(r, rma->iputSignal(r->rctx, c, (uint64_t)k * chunk, kind == 1 ? r->src_mh : NULL,
				       kind == 1 ? len : 0, dst, kind == 1 ? r->win_mh : NULL,
				       (uint32_t)p, (uint64_t)(r->rank * MAXC + c) * 8, r->sig_mh,
				       add, NCCL_NET_SIGNAL_OP_ADD, true, &o->req));
}

static void body_mix(struct rank *r)
{
	struct grp *g = r->g;
	size_t chunk = g->slot / MAXC;
	uint64_t s = g->seed * 7919 + (uint64_t)r->rank * 104729 + 1;
	struct mix_op ops[MIX_FLIGHT] = { 0 };
	size_t region = g->slot / MAXC;
	int nops = live ? MIX_OPS_LIVE : MIX_OPS;

	for (int i = 0; i < nops && !r->fail[0]; i++) {
		mix_done(r, &ops[i % MIX_FLIGHT], chunk, i % MIX_FLIGHT);
		mix_post(r, &s, &ops[i % MIX_FLIGHT], chunk, i % MIX_FLIGHT);
	}
	for (int k = 0; k < MIX_FLIGHT; k++)
		mix_done(r, &ops[k], chunk, k);
	pthread_barrier_wait(&g->h.bar);
	for (int q = 0; q < g->h.n && !r->fail[0]; q++) {
		for (int c = 0; c < g->nctx && !r->fail[0]; c++) {
			const char *w = r->win + (size_t)q * g->slot + (size_t)c * region;

			RCHECK(r, !memcmp(w, mixm.model[q][r->rank][c], region), "the region of rank "
			       "%d, context %d differs from what it put", q, c);
			RCHECK(r, r->sig[q * MAXC + c] == mixm.sum[q][r->rank][c], "signal of rank %d, "
			       "context %d: %llu, it added %llu", q, c,
			       (unsigned long long)r->sig[q * MAXC + c],
			       (unsigned long long)mixm.sum[q][r->rank][c]);
		}
	}
}

static void mix_run(uint64_t seed)
{
	int n = 2 + (int)(seed % 3);
	size_t slot = 2 * 4096;

	memset(&mixm, 0, sizeof(mixm));
	for (int a = 0; a < n; a++)
		for (int b = 0; b < n; b++)
			for (int c = 0; c < MAXC; c++)
				assert_non_null(mixm.model[a][b][c] = calloc(1, slot / MAXC));
	print_message("random mix: RMA_IB_SEED=%llu (%d ranks, %d contexts, %d operations "
		      "each%s)\n", (unsigned long long)seed, n, MAXC, live ? MIX_OPS_LIVE : MIX_OPS,
		      live ? ", live" : "");
	run_group_seed(roce, n, MAXC, slot, seed, body_mix);
	for (int a = 0; a < n; a++)
		for (int b = 0; b < n; b++)
			for (int c = 0; c < MAXC; c++)
				free(mixm.model[a][b][c]);
}

static void test_random_mix(void **state)
{
	const char *env = getenv("RMA_IB_SEED");
	uint64_t base = (uint64_t)time(NULL);

	(void)state;
	if (env && env[0]) {
		mix_run(strtoull(env, NULL, 0));
		return;
	}
	/* Seed base * 3 + k has 2 + k ranks; live, only 3 ranks (time). */
	for (uint64_t k = live ? 1 : 0; k < (live ? 2u : 3u); k++)
		mix_run(base * 3 + k);
}

#include "rma_ib_gpu.h"

/* ---- harness ----------------------------------------------------------------- */

/* The fake provider's files and variables (not used live). */
static int fake_setup(void)
{
	const char *env = getenv("RAIL_FAKEVERBS_LIB"), *slash;
	char mlx5[PATH_MAX + 32], sub[160];

	if (env && env[0])
		snprintf(fakelib, sizeof(fakelib), "%s", env);
	slash = strrchr(fakelib, '/');
	snprintf(mlx5, sizeof(mlx5), "%.*s/libfakemlx5.so", slash ? (int)(slash - fakelib) : 1,
		 slash ? fakelib : ".");
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/rail-rmaib-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		tmpdir[0] = 0;
		return -1;
	}
	snprintf(confpath, sizeof(confpath), "%s/devices.conf", tmpdir);
	setenv("NCCL_IBVERBS_LIB", fakelib, 1);
	setenv("NCCL_RAIL_MLX5_LIB", mlx5, 1);
	setenv("RAIL_FAKEVERBS_CONF", confpath, 1);
	snprintf(sub, sizeof(sub), "%s/verbs.log", tmpdir);
	setenv("RAIL_FAKEVERBS_LOG", sub, 1);
	setenv("RAIL_FAKEVERBS_SYSFS", tmpdir, 1);
	setenv("NCCL_RAIL_SYSFS_ROOT", tmpdir, 1);
	return 0;
}

static int group_setup(void **state)
{
	(void)state;
	if (!live && fake_setup())
		return -1;
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", live ? "60" : "20", 1);
	if (!live && access(fakelib, R_OK))
		return 0;
	if (!live) {
		setenv("RAIL_FAKECUDA_LIB", fakecuda, 1);	/* the fake verbs reach its memory */
		fcu = dlopen(fakecuda, RTLD_NOW | RTLD_LOCAL);
		if (fcu) {
			*(void **)&fcu_alloc = dlsym(fcu, "fcu_test_alloc_device");
			*(void **)&fcu_host = dlsym(fcu, "fcu_test_host");
			*(void **)&fcu_dmabuf = dlsym(fcu, "fcu_test_dmabuf");
		}
	}
	rma = rmah_open(plugin, "ncclRmaPlugin_v14", &lib);
	return 0;
}

static int group_teardown(void **state)
{
	char cmd[128];

	(void)state;
	if (lib)
		dlclose(lib);
	if (fcu)
		dlclose(fcu);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (tmpdir[0] && system(cmd) != 0)
		print_message("could not remove %s\n", tmpdir);
	return 0;
}

static int need_plugin(void **state)
{
	(void)state;
	if (!lib || !rma) {
		if (live)
			printf("SKIP: %s not loadable: run make all\n", plugin);
		else
			printf("SKIP: %s or %s not loadable: run make tests\n", plugin, fakelib);
		skip();
	}
	return 0;
}

/* Live: whether the machine's libibverbs lists a device (why, if not). */
static int have_rdma(char *why, size_t why_len)
{
	struct ibv_device **l;
	int n = 0;

	if (rail_verbs_load(why, why_len))
		return 0;
	l = rail_ibv.get_device_list(&n);
	if (l)
		rail_ibv.free_device_list(l);
	rail_verbs_unload();
	if (n <= 0)
		snprintf(why, why_len, "no RDMA device");
	return n > 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_declines_by_default, need_plugin),
		cmocka_unit_test_setup(test_declines_without_atomics, need_plugin),
		cmocka_unit_test_setup(test_put_signal_get_2, need_plugin),
		cmocka_unit_test_setup(test_put_signal_get_4, need_plugin),
		cmocka_unit_test_setup(test_size0_signal, need_plugin),
		cmocka_unit_test_setup(test_signal_after_puts, need_plugin),
		cmocka_unit_test_setup(test_errors_named, need_plugin),
		cmocka_unit_test_setup(test_random_mix, need_plugin),
		cmocka_unit_test_setup(test_gpu_dmabuf, need_plugin),
		cmocka_unit_test_setup(test_gpu_peermem, need_plugin),
		cmocka_unit_test_setup(test_gpu_host_only, need_plugin),
	};
	const char *req = getenv("RAIL_TEST_REQUIRE_RDMA"), *lv = getenv("RMA_IB_LIVE");
	char build_dir[PATH_MAX], why[256] = "";

	(void)argc;
	alarm(300);	/* a hung group fails the run instead of holding it */
	setenv("NCCL_RAIL_RMA_IB", "1", 1);	/* the backend is opt-in (test_declines_by_default) */
	live = lv && atoi(lv) == 1;
	if (live) {
		wait_ns = 60ull * 1000000000ull;
		rail_params_reload();
		if (!have_rdma(why, sizeof(why))) {
			if (req && atoi(req)) {
				printf("test_rma_ib: RMA_IB_LIVE=1 and RAIL_TEST_REQUIRE_RDMA=1, but %s\n",
				       why);
				return 1;
			}
			printf("test_rma_ib: RMA_IB_LIVE=1: all %zu tests skipped: %s (they run in the "
			       "rxe guest: test/rxe/run.sh --tests 18-ib-rma)\n",
			       sizeof(tests) / sizeof(tests[0]), why);
			return 0;
		}
		printf("test_rma_ib: live, on the machine's RDMA devices\n");
	}
	unit_build_dir(argv[0], build_dir, sizeof(build_dir));
	rmah_plugin_path(argv[0], plugin, sizeof(plugin));
	snprintf(fakelib, sizeof(fakelib), "%.*s/test/fakeverbs/libfakeverbs.so", PATH_MAX - 64,
		 build_dir);
	rmah_fake_cuda_path(argv[0], fakecuda, sizeof(fakecuda));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
