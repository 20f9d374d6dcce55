/*
 * nccl-net-rail unit tests: the RMA table v13 (ncclRmaPlugin_v13), driven
 * through the exported symbol as NCCL 2.30.7's v13 adapter drives it: init
 * followed by getProperties(0), which must report the GIN proxy type; a
 * GIN v13 config without a stride (every rank a target); regMrSym with its
 * GIN handle out-parameter; iputSignal without the strong flag; progress
 * through ginProgress. Ranks are threads over loopback TCP, as in
 * test_rma.c. Skips, saying why, when the plugin is not built.
 */
#include "unit.h"

#include <unistd.h>

#include "rma_harness.h"
#include "rma_v13.h"

static char plugin[PATH_MAX];
static void *lib;
static ncclRma_v13_t *rma;

#define NR 2
#define SLOT (64u << 10)
#define WAIT_NS (30ull * 1000000000ull)
#define JUNK ((void *)(uintptr_t)0x5a5a5a5a5a5a5a5aull)

struct rank {
	int rank;
	void *ctx, *lc, *coll, *rctx;
	char *src, *win;
	uint64_t *sig;
	void *src_mh, *win_mh, *sig_mh;
	char fail[512];
};

static struct rmah_group grp;	/* handles, hptr, bar */

static uint8_t pattern(int from, int to, size_t i)
{
	return (uint8_t)(from * 29 + to * 11 + i * 7 + 3);
}

/* NCCL's proxy loop: ginProgress, then test, until done. */
static void wait_req(struct rank *r, void *req)
{
	uint64_t until = rmah_now_ns() + WAIT_NS;
	ncclResult_t res;
	int done = 0;

	do {
		ROK(r, rma->ginProgress(r->rctx));
		res = rma->test(r->coll, req, &done);
	} while (res == ncclSuccess && !done && rmah_now_ns() < until);
	ROK(r, res);
	RCHECK(r, done, "request %p not done in 30 s", req);
}

static void wait_sig(struct rank *r, int from, uint64_t want)
{
	uint64_t until = rmah_now_ns() + WAIT_NS;

	while (__atomic_load_n(&r->sig[from], __ATOMIC_ACQUIRE) < want && rmah_now_ns() < until) {
		ROK(r, rma->ginProgress(r->rctx));
		sched_yield();
	}
	RCHECK(r, r->sig[from] == want, "signal of rank %d is %llu, want %llu", from,
	       (unsigned long long)r->sig[from], (unsigned long long)want);
}

/* NCCL's v13 adapter: init, then refuse anything but the GIN proxy type. */
static ncclResult_t adapter_init(void **ctx, uint64_t comm_id)
{
	ncclNetProperties_v12_t props;
	ncclResult_t res = rma->init(ctx, comm_id, unit_log_sink);

	if (res != ncclSuccess)
		return res;
	memset(&props, 0, sizeof(props));
	res = rma->getProperties(0, &props);
	if (res != ncclSuccess)
		return res;
	return props.netDeviceType == NCCL_NET_DEVICE_GIN_PROXY ? ncclSuccess : ncclInternalError;
}

static void reg(struct rank *r, void *data, size_t size, uint64_t flags, void **mh)
{
	void *gin_handle = JUNK;

	ROK(r, rma->regMrSym(r->coll, data, size, NCCL_PTR_HOST, flags, mh, &gin_handle));
	RCHECK(r, gin_handle == NULL, "regMrSym left the GIN handle at %p", gin_handle);
}

static void rank_up(struct rank *r)
{
	/* The GIN v13 fields NCCL's adapter leaves 0; no rankStride. */
	ncclGinConfig_v13_t cfg = { .nContexts = 2, .trafficClass = -1 };
	ncclNetDeviceHandle_v11_t *dev_handle = JUNK;
	size_t wsize = NR * SLOT;

	ROK(r, adapter_init(&r->ctx, 0x1300 + (uint64_t)r->rank));
	ROK(r, rma->listen(r->ctx, 0, grp.handles[r->rank], &r->lc));
	pthread_barrier_wait(&grp.bar);		/* NCCL's allgather of the handles */
	ROK(r, rma->connect(r->ctx, grp.hptr, NR, r->rank, r->lc, &r->coll));
	ROK(r, rma->closeListen(r->lc));
	ROK(r, rma->createContext(r->coll, &cfg, &r->rctx, &dev_handle));
	RCHECK(r, dev_handle == NULL, "createContext left the device handle at %p",
	       (void *)dev_handle);
	r->src = calloc(1, wsize);
	r->win = calloc(1, wsize);
	r->sig = calloc(NR, 8);
	reg(r, r->src, wsize, 0, &r->src_mh);
	reg(r, r->win, wsize, 0, &r->win_mh);
	reg(r, r->sig, NR * 8, NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET,
	    &r->sig_mh);
}

/*
 * Every rank puts a pattern into its slot of every rank's window with a
 * signal (INC from rank 0, ADD 1000 + rank from rank 1) on context 1, then
 * reads its peer's slot of itself back with iget on context 0.
 */
static void body(struct rank *r)
{
	void *req[NR];
	bool err = true;

	for (size_t i = 0; i < SLOT; i++)
		for (int p = 0; p < NR; p++)
			r->src[(size_t)p * SLOT + i] = (char)pattern(r->rank, p, i);
	for (int p = 0; p < NR; p++) {
		req[p] = NULL;
		ROK(r, rma->iputSignal(r->rctx, 1, (uint64_t)p * SLOT, r->src_mh, SLOT,
				       (uint64_t)r->rank * SLOT, r->win_mh, (uint32_t)p,
				       (uint64_t)r->rank * 8, r->sig_mh, 1000 + (uint64_t)r->rank,
				       r->rank ? NCCL_NET_SIGNAL_OP_ADD : NCCL_NET_SIGNAL_OP_INC,
				       &req[p]));
		RCHECK(r, req[p] != NULL, "iputSignal to rank %d gave no request", p);
	}
	for (int p = 0; p < NR && !r->fail[0]; p++)
		wait_req(r, req[p]);
	for (int q = 0; q < NR && !r->fail[0]; q++) {
		wait_sig(r, q, q ? 1000 + (uint64_t)q : 1);
		for (size_t i = 0; i < SLOT && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)r->win[(size_t)q * SLOT + i] == pattern(q, r->rank, i),
			       "byte %zu from rank %d", i, q);
	}
	pthread_barrier_wait(&grp.bar);		/* every window complete */
	if (!r->fail[0]) {
		int peer = 1 - r->rank;
		void *rq = NULL;

		memset(r->src, 0, SLOT);
		ROK(r, rma->iget(r->rctx, 0, (uint64_t)r->rank * SLOT, r->win_mh, SLOT, 0,
				 r->src_mh, (uint32_t)peer, &rq));
		RCHECK(r, rq != NULL, "%s", "iget gave no request");
		if (rq)
			wait_req(r, rq);
		for (size_t i = 0; i < SLOT && !r->fail[0]; i++)
			RCHECK(r, (uint8_t)r->src[i] == pattern(r->rank, peer, i),
			       "iget from rank %d: byte %zu", peer, i);
	}
	ROK(r, rma->queryLastError(r->rctx, &err));
	RCHECK(r, !err, "%s", "queryLastError reports an error");
}

static void rank_down(struct rank *r)
{
	pthread_barrier_wait(&grp.bar);		/* nobody puts into what is going away */
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
	pthread_barrier_wait(&grp.bar);
	if (!r->fail[0])
		body(r);
	else
		pthread_barrier_wait(&grp.bar);	/* the one in body */
	rank_down(r);
	return NULL;
}

/* ---- the tests ------------------------------------------------------------- */

static void test_exported(void **state)
{
	(void)state;
	assert_non_null(rma);		/* absent: NCCL 2.30.7 finds no v13 table */
	assert_string_equal(rma->name, "Rail");
	assert_non_null(rma->init);
	assert_non_null(rma->getProperties);
	assert_non_null(rma->createContext);
	assert_non_null(rma->regMrSym);
	assert_non_null(rma->regMrSymDmaBuf);
	assert_non_null(rma->iputSignal);
	assert_non_null(rma->test);
	assert_non_null(rma->ginProgress);
	assert_non_null(rma->finalize);
	/* Not a GIN plugin: NCCL skips external GIN proxies, the RMA table serves. */
	assert_null(dlsym(lib, "ncclGinPlugin_v13"));
}

static void test_init_as_adapter(void **state)
{
	void *ctx = NULL;
	int ndev = 0;

	(void)state;
	assert_non_null(rma);
	unit_log_reset();
	assert_int_equal(adapter_init(&ctx, 1), ncclSuccess);
	unit_assert_logged(RAIL_LOG_INFO, "RMA (ABI v13): served by the tcp backend");
	assert_int_equal(rma->devices(&ndev), ncclSuccess);
	assert_true(ndev >= 1);
	assert_int_equal(rma->finalize(ctx), ncclSuccess);
}

static void test_two_ranks(void **state)
{
	struct rank rs[NR];
	const char *fail;

	(void)state;
	assert_non_null(rma);
	memset(rs, 0, sizeof(rs));
	for (int i = 0; i < NR; i++)
		rs[i].rank = i;
	fail = RMAH_RUN(&grp, NR, rs, rank_main);
	if (fail) {
		unit_log_dump();
		fail_msg("%s", fail);
	}
}

/* ---- harness ----------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	rmah_tcp_env();
	rma = rmah_open(plugin, "ncclRmaPlugin_v13", &lib);
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
		cmocka_unit_test_setup(test_init_as_adapter, need_plugin),
		cmocka_unit_test_setup(test_two_ranks, need_plugin),
	};

	(void)argc;
	alarm(120);	/* a hung group fails the run instead of holding it */
	rmah_plugin_path(argv[0], plugin, sizeof(plugin));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
