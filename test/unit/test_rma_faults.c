/*
 * nccl-net-rail unit tests: a seeded randomized search of one-sided RMA
 * over TCP with a connection cut at a random moment.
 *
 * Ranks are threads over loopback TCP driving ncclRmaPlugin_v14 of the
 * built plugin (rma_harness.h). Each rank sends its right neighbour rounds
 * of puts (small ones on the stream, large ones striped over the lanes),
 * each round into a region of the window of its own and closed by a signal
 * (INC). Meanwhile a thread shuts down one of the process's connected TCP
 * sockets (every one is the plugin's: streams, lanes, the mesh) at a time
 * drawn from the seed, or none. What must hold whatever the cut:
 *   - every request finishes, done or failed, within 10 s, and so does
 *     the teardown: no hang;
 *   - a signal is never there before its data: when the signal word from
 *     the left neighbour says v rounds, regions 0..v-1 hold every byte of
 *     those rounds' puts in program order (no silent corruption);
 *   - a failure is named: a request that failed, or a round that never
 *     arrived, comes with a WARN of the plugin;
 *   - with nothing failed and nothing logged, every round arrived.
 * RMA_FAULT_SEED=N replays one seed's plan (sizes, offsets, the cut's time
 * and victim); RMA_FAULT_SEEDS=K runs K seeds from the clock (default 10).
 * test_cut_seeded_gpu does the same with the source and target windows in
 * the fake CUDA driver's device memory (test/fakecuda, RAIL_FAKECUDA_LIB or
 * the build's copy), so that cuts also meet copies in flight: a put's
 * source staged out of the GPU, bytes landing into it (skipped, saying
 * why, without the fake).
 */
#include "unit.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rail.h"
#include "rma_harness.h"
#include "rma_v14.h"
#include "../fakecuda/fakecuda.h"

static char plugin[PATH_MAX], fake_path[PATH_MAX];
static void *lib, *fake;
static ncclRma_v14_t *rma;
static fcu_alloc_device_fn fcu_alloc;
static fcu_host_fn fcu_host;
static fcu_make_current_fn fcu_current;
static int gpu;		/* windows in the fake's device memory */

/* The host's view of a window's bytes (the fake's, for device memory). */
static char *view(void *p)
{
	return gpu ? (char *)fcu_host(p) : (char *)p;
}

#define WAIT_NS (20ull * 1000000000ull)
#define ROUNDS 4
#define PUTS 12
#define REGION (2u << 20)		/* one round's part of the window */
#define WSIZE (ROUNDS * REGION)
#define SLOW_NS (10ull * 1000000000ull)	/* a request that takes longer is late */

struct grp {
	struct rmah_group h;
	unsigned seed;
	atomic_int failed;	/* requests that failed, all ranks */
	_Atomic uint64_t slowest;	/* the longest wait for a request to finish (ns) */
};

struct rank {
	struct grp *g;
	int rank;
	void *ctx, *lc, *coll, *rctx;
	char *src, *win;
	uint64_t *sig;
	void *src_mh, *win_mh, *sig_mh;
	uint64_t got;		/* rounds whose signal came from the left */
	char fail[512];
};

struct plan_put {
	size_t size, off;
};

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

/* Round round of rank from: PUTS puts inside the round's region; whether its last carries the signal. */
static int plan(unsigned seed, int from, int round, struct plan_put *p)
{
	unsigned s = seed * 2654435761u + (unsigned)from * 7919u + (unsigned)round * 104729u + 1;

	for (int i = 0; i < PUTS; i++) {
		unsigned kind = rnd(&s) % 10;

		p[i].size = kind < 5 ? 1 + rnd(&s) % 20000 : (512u << 10) + rnd(&s) % (REGION / 2);
		p[i].off = (size_t)round * REGION + rnd(&s) % (REGION - p[i].size + 1);
	}
	return rnd(&s) % 2;
}

static char pbyte(int from, int round, int i, size_t b)
{
	return (char)(from * 29 + round * 13 + i * 5 + (b * 7 ^ b >> 9) + 1);
}

/* Wait for req: 1 done, 0 failed (counted); a request that never finishes fails the rank. */
static int finish(struct rank *r, void *req)
{
	uint64_t t0 = rmah_now_ns(), took, was;
	ncclResult_t res;
	int done = rmah_test_until(rma->test, r->coll, req, WAIT_NS, 1, &res);

	took = rmah_now_ns() - t0;
	was = atomic_load(&r->g->slowest);
	while (took > was && !atomic_compare_exchange_weak(&r->g->slowest, &was, took))
		;
	if (res != ncclSuccess) {
		atomic_fetch_add(&r->g->failed, 1);
		return 0;
	}
	RCHECK(r, done, "request %p neither done nor failed in 20 s (RMA_FAULT_SEED=%u)", req,
	       r->g->seed);
	return done;
}

/* Posts one round to rank to, four requests in flight; stops at its first failure. */
static int send_round(struct rank *r, int round, int to)
{
	struct plan_put p[PUTS];
	int carry = plan(r->g->seed, r->rank, round, p), ok = 1;
	void *req[4] = { 0 };
	size_t quarter = WSIZE / 4;

	for (int i = 0; i <= PUTS && ok && !r->fail[0]; i++) {
		int k = i % 4, sig = i == PUTS || (carry && i == PUTS - 1);
		size_t so = (size_t)k * quarter, n = i < PUTS ? p[i].size : 0;
		ncclResult_t res;

		if (req[k] && !(ok = finish(r, req[k])))
			break;
		req[k] = NULL;
		if (i == PUTS && carry)
			break;
		for (size_t b = 0; b < n; b++)
			view(r->src)[so + b] = pbyte(r->rank, round, i, b);
		if (sig)
			res = rma->iputSignal(r->rctx, 0, so, n ? r->src_mh : NULL, n,
					      n ? p[i].off : 0, n ? r->win_mh : NULL, (uint32_t)to,
					      (uint64_t)r->rank * 8, r->sig_mh, 1,
					      NCCL_NET_SIGNAL_OP_INC, true, &req[k]);
		else
			res = rma->iput(r->rctx, 0, so, r->src_mh, n, p[i].off, r->win_mh,
					(uint32_t)to, &req[k]);
		if (res != ncclSuccess) {
			atomic_fetch_add(&r->g->failed, 1);
			req[k] = NULL;
			ok = 0;
		}
	}
	for (int k = 0; k < 4; k++)
		if (req[k] && !finish(r, req[k]))
			ok = 0;
	return ok;
}

/* Regions 0..got-1 from the left hold what its rounds' puts leave in order. */
static void check_arrived(struct rank *r, int from)
{
	char *ref = malloc(REGION);
	struct plan_put p[PUTS];

	for (int round = 0; ref && round < (int)r->got && !r->fail[0]; round++) {
		const char *w = view(r->win) + (size_t)round * REGION;

		memset(ref, 0, REGION);
		plan(r->g->seed, from, round, p);
		for (int i = 0; i < PUTS; i++)
			for (size_t b = 0; b < p[i].size; b++)
				ref[p[i].off - (size_t)round * REGION + b] = pbyte(from, round, i, b);
		for (size_t b = 0; b < REGION; b++) {
			if (w[b] != ref[b]) {
				RFAIL(r, "rank %d: the signal from rank %d says %llu rounds, but byte "
				      "%zu of round %d is %d where the puts leave %d (RMA_FAULT_SEED=%u)",
				      r->rank, from, (unsigned long long)r->got, b, round, w[b],
				      ref[b], r->g->seed);
				break;
			}
		}
	}
	free(ref);
}

static void body(struct rank *r)
{
	int n = r->g->h.n, to = (r->rank + 1) % n, from = (r->rank + n - 1) % n;
	uint64_t last = 0, quiet_since = rmah_now_ns();

	for (int round = 0; round < ROUNDS && send_round(r, round, to); round++)
		;
	/* What the left sends: all rounds, or nothing new for 1 s once anything failed. */
	for (;;) {
		uint64_t v = __atomic_load_n(&r->sig[from], __ATOMIC_ACQUIRE), now = rmah_now_ns();

		if (v != last) {
			last = v;
			quiet_since = now;
		}
		if (v >= ROUNDS || now - quiet_since > WAIT_NS ||
		    ((atomic_load(&r->g->failed) || unit_log_count(RAIL_LOG_WARN, "RMA")) &&
		     now - quiet_since > 1000000000ull))
			break;
		usleep(2000);
	}
	r->got = last;
	check_arrived(r, from);
}

static void rank_up(struct rank *r)
{
	ncclRmaConfig_v14_t cfg = { .nContexts = 1, .trafficClass = -1, .rankStride = 1 };
	size_t ssize = ((size_t)r->g->h.n + 1) * 8;

	if (gpu)
		fcu_current();	/* NCCL's thread: its device is current */
	ROK(r, rma->init(&r->ctx, 0x3000 + (uint64_t)r->rank, unit_log_sink));
	ROK(r, rma->listen(r->ctx, 0, r->g->h.handles[r->rank], &r->lc));
	pthread_barrier_wait(&r->g->h.bar);
	ROK(r, rma->connect(NULL, r->g->h.hptr, r->g->h.n, r->rank, r->lc, &r->coll));
	ROK(r, rma->closeListen(r->lc));
	ROK(r, rma->createContext(r->coll, &cfg, &r->rctx));
	r->src = gpu ? fcu_alloc(WSIZE) : calloc(1, WSIZE);
	r->win = gpu ? fcu_alloc(WSIZE) : calloc(1, WSIZE);
	r->sig = calloc(1, ssize);
	ROK(r, rma->regMrSym(r->coll, r->src, WSIZE, gpu ? NCCL_PTR_CUDA : NCCL_PTR_HOST, 0,
			     &r->src_mh));
	ROK(r, rma->regMrSym(r->coll, r->win, WSIZE, gpu ? NCCL_PTR_CUDA : NCCL_PTR_HOST, 0,
			     &r->win_mh));
	ROK(r, rma->regMrSym(r->coll, r->sig, ssize, NCCL_PTR_HOST,
			     NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET,
			     &r->sig_mh));
}

/* Teardown after a cut: each call returns (its result is not asked for). */
static void rank_down(struct rank *r)
{
	pthread_barrier_wait(&r->g->h.bar);
	if (gpu)
		fcu_current();
	if (r->coll) {
		rma->deregMrSym(r->coll, r->src_mh);
		rma->deregMrSym(r->coll, r->win_mh);
		rma->deregMrSym(r->coll, r->sig_mh);
		rma->destroyContext(r->rctx);
		rma->closeColl(r->coll);
	}
	rma->finalize(r->ctx);
	if (!gpu) {	/* the fake's device memory is never given back */
		free(r->src);
		free(r->win);
	}
	free(r->sig);
}

/* ---- the cut -------------------------------------------------------------- */

static struct {
	unsigned seed;
	int fd;			/* the socket shut down, -1 none */
	char what[96];
} cut;

/* The process's connected TCP sockets, in fd order: how many (at most max). */
static int tcp_sockets(int *fds, int max)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)) && n < max) {
		int fd = atoi(e->d_name), listening = 0;
		socklen_t len = sizeof(listening);
		struct sockaddr_storage a;
		socklen_t alen = sizeof(a);
		struct stat st;

		if (e->d_name[0] == '.' || fstat(fd, &st) || !S_ISSOCK(st.st_mode) ||
		    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) || listening ||
		    getpeername(fd, (struct sockaddr *)&a, &alen))
			continue;
		fds[n++] = fd;
	}
	if (d)
		closedir(d);
	for (int i = 1; i < n; i++)	/* insertion sort: readdir's order is the kernel's */
		for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
			int t = fds[j];

			fds[j] = fds[j - 1];
			fds[j - 1] = t;
		}
	return n;
}

static void *cutter(void *arg)
{
	unsigned s = cut.seed * 40503u + 7;
	int fds[256], n, pick;
	struct sockaddr_in me, peer;
	socklen_t ml = sizeof(me), pl = sizeof(peer);

	(void)arg;
	usleep((useconds_t)(rnd(&s) % 60) * 1000);	/* 0-59 ms into the rounds */
	n = tcp_sockets(fds, 256);
	pick = (int)(rnd(&s) % (unsigned)(n ? n : 1));
	if (!n)
		return NULL;
	cut.fd = fds[pick];
	getsockname(cut.fd, (struct sockaddr *)&me, &ml);
	getpeername(cut.fd, (struct sockaddr *)&peer, &pl);
	snprintf(cut.what, sizeof(cut.what), "fd %d of %d (port %u to %u)", cut.fd, n,
		 ntohs(me.sin_port), ntohs(peer.sin_port));
	shutdown(cut.fd, SHUT_RDWR);
	return NULL;
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;
	pthread_t th;
	int cutting = 0;

	rank_up(r);
	pthread_barrier_wait(&r->g->h.bar);
	if (r->rank == 0 && r->g->seed % 5 != 0)	/* one seed in five cuts nothing */
		cutting = !pthread_create(&th, NULL, cutter, NULL);
	if (!r->fail[0])
		body(r);
	if (cutting)
		pthread_join(th, NULL);
	rank_down(r);
	return NULL;
}

/* One seed on n ranks: the invariants of the file's comment. */
static void run_seed(unsigned seed, int n)
{
	struct grp g = { .seed = seed };
	struct rank rs[RMAH_MAXR];
	const char *fail;
	uint64_t got = ROUNDS;
	int warns;

	memset(rs, 0, sizeof(rs));
	for (int i = 0; i < n; i++) {
		rs[i].g = &g;
		rs[i].rank = i;
	}
	cut.seed = seed;
	cut.fd = -1;
	snprintf(cut.what, sizeof(cut.what), "nothing");
	unit_log_reset();
	fail = RMAH_RUN(&g.h, n, rs, rank_main);
	for (int i = 0; i < n; i++)
		got = RAIL_MIN(got, rs[i].got);
	warns = unit_log_count(RAIL_LOG_WARN, "RMA");
	printf("fault seed %u, %d ranks: cut %s; %d requests failed, %d WARNs, fewest rounds "
	       "arrived %llu of %d, slowest request %.0f ms\n", seed, n, cut.what,
	       atomic_load(&g.failed), warns, (unsigned long long)got, ROUNDS,
	       (double)atomic_load(&g.slowest) / 1e6);
	if (!fail && (atomic_load(&g.failed) || got < ROUNDS) && !warns)
		fail = "a request failed or a round never arrived, and the plugin logged no WARN";
	if (!fail && atomic_load(&g.slowest) > SLOW_NS)
		fail = "a request took more than 10 s to finish: a cut must fail it at once";
	if (fail) {
		unit_log_dump();
		fail_msg("%s (cut %s; replay: RMA_FAULT_SEED=%u)", fail, cut.what, seed);
	}
}

static void run_seeds(void)
{
	const char *one = getenv("RMA_FAULT_SEED"), *many = getenv("RMA_FAULT_SEEDS");
	unsigned base = one ? (unsigned)strtoul(one, NULL, 0) : (unsigned)time(NULL);
	int seeds = one ? 1 : many ? atoi(many) : 10;

	for (int k = 0; k < seeds; k++)
		run_seed(base + (unsigned)k, (base + (unsigned)k) % 3 == 0 ? 3 : 2);
}

static void test_cut_seeded(void **state)
{
	(void)state;
	gpu = 0;
	run_seeds();
}

static void test_cut_seeded_gpu(void **state)
{
	fcu_set_delay_fn delay = fake ? (fcu_set_delay_fn)dlsym(fake, "fcu_test_set_delay_us")
				      : NULL;

	(void)state;
	if (!fake || !fcu_alloc || !fcu_host || !fcu_current || !delay) {
		printf("SKIP: the fake CUDA driver %s is not loadable: run make tests\n", fake_path);
		skip();
	}
	gpu = 1;
	delay(20);	/* every copy of the fake 20 us: cuts meet copies in flight */
	printf("GPU windows (the fake driver)\n");
	run_seeds();
	delay(0);
	gpu = 0;
}

static int setup(void **state)
{
	(void)state;
	rmah_tcp_env();
	setenv("NCCL_RAIL_RMA_STALL_WARN", "0", 1);	/* the check's lines are not failures */
	setenv("NCCL_RAIL_CUDA_LIB", fake_path, 1);
	fake = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
	if (fake) {
		*(void **)&fcu_alloc = dlsym(fake, "fcu_test_alloc_device");
		*(void **)&fcu_host = dlsym(fake, "fcu_test_host");
		*(void **)&fcu_current = dlsym(fake, "fcu_test_make_current");
	}
	rma = rmah_open(plugin, "ncclRmaPlugin_v14", &lib);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return rmah_close(lib);
}

static int need_plugin(void **state)
{
	(void)state;
	rmah_need_plugin(lib && rma ? lib : NULL, plugin);
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_cut_seeded, need_plugin),
		cmocka_unit_test_setup(test_cut_seeded_gpu, need_plugin),
	};

	(void)argc;
	alarm(600);
	rmah_plugin_path(argv[0], plugin, sizeof(plugin));
	rmah_fake_cuda_path(argv[0], fake_path, sizeof(fake_path));
	return cmocka_run_group_tests(tests, setup, teardown);
}
