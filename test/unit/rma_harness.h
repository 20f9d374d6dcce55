/*
 * nccl-net-rail unit tests: the harness of the RMA table tests
 * (test_rma*.c): the built plugin loaded with dlopen and its table looked
 * up, as NCCL does; a group of ranks, threads of this process, that meet at
 * a barrier and exchange their listen handles through it (NCCL's
 * allgather); a rank's failure kept as text, the first one failing the
 * test; waiting for a request or a signal word. Nothing here calls a table
 * entry but test, whose signature is the same in every ABI version.
 * Include after unit.h in one test file.
 *
 *   struct grp { struct rmah_group h; ... };     n, handles, hptr, bar
 *   struct rank { int rank; char fail[512]; ... };
 *   rma = rmah_open(plugin, "ncclRmaPlugin_v14", &lib);
 *   RCHECK(r, cond, "what, %d", x);  ROK(r, rma->listen(...));
 *   fail = RMAH_RUN(&g.h, n, rs, rank_main);   threads run, joined
 *   done = rmah_test_until(rma->test, coll, req, wait_ns, yield, &res);
 *   n = rmah_striped_logged();     puts logged at close as striped
 *   rmah_fake_cuda_path(argv[0], path, len);   the fake CUDA driver's path
 */
#ifndef RAIL_TEST_RMA_HARNESS_H
#define RAIL_TEST_RMA_HARNESS_H

#include "unit.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "nccl_common.h"

#define RMAH_MAXR 4
#define RMAH_HSIZE NCCL_NET_HANDLE_MAXSIZE

/* What a group of n ranks shares: their listen handles and a barrier of n. */
struct rmah_group {
	int n;
	char handles[RMAH_MAXR][RMAH_HSIZE];
	void *hptr[RMAH_MAXR];	/* hptr[i] = handles[i]: connect's list */
	pthread_barrier_t bar;
};

/* A rank r (any struct with int rank and char fail[]) fails, first failure kept. */
#define RFAIL(r, ...)                                                              \
	do {                                                                       \
		if (!(r)->fail[0])                                                 \
			snprintf((r)->fail, sizeof((r)->fail), __VA_ARGS__);       \
	} while (0)
#define RCHECK(r, cond, ...)                                                       \
	do {                                                                       \
		if (!(cond) && !(r)->fail[0]) {                                    \
			int n_ = snprintf((r)->fail, sizeof((r)->fail),            \
					  "rank %d, line %d: %s: ", (r)->rank, __LINE__, #cond); \
			snprintf((r)->fail + n_, sizeof((r)->fail) - (size_t)n_, __VA_ARGS__); \
		}                                                                  \
	} while (0)
#define ROK(r, call) RCHECK(r, (call) == ncclSuccess, "%s", "the call failed")

static inline uint64_t rmah_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The byte i that rank from writes for rank to. */
static inline uint8_t rmah_pattern(int from, int to, size_t i)
{
	return (uint8_t)(from * 31 + to * 7 + i * 13 + 1);
}

/*
 * The plugin at path, its table sym looked up: the table, or NULL. *lib is
 * the library (NULL if it did not load); the caller closes it.
 */
static inline void *rmah_open(const char *path, const char *sym, void **lib)
{
	*lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	return *lib ? dlsym(*lib, sym) : NULL;
}

/* A group teardown's part: the plugin, if loaded, closed. */
static inline int rmah_close(void *lib)
{
	if (lib)
		dlclose(lib);
	return 0;
}

/* A test's setup part: skips it, saying why, when the plugin did not load. */
static inline void rmah_need_plugin(const void *lib, const char *plugin)
{
	if (!lib) {
		printf("SKIP: %s not loadable (%s): run make plugin\n", plugin, dlerror());
		skip();
	}
}

/* The plugin's path next to the test binary argv0. */
static inline void rmah_plugin_path(const char *argv0, char *out, size_t len)
{
	char build_dir[PATH_MAX];

	unit_build_dir(argv0, build_dir, sizeof(build_dir));
	snprintf(out, len, "%.*s/libnccl-net-rail.so", PATH_MAX - 32, build_dir);
}

/* The fake CUDA driver (test/fakecuda): RAIL_FAKECUDA_LIB when set, else the build's copy. */
static inline void rmah_fake_cuda_path(const char *argv0, char *out, size_t len)
{
	const char *env = getenv("RAIL_FAKECUDA_LIB");
	char build_dir[PATH_MAX];

	if (env && env[0]) {
		snprintf(out, len, "%s", env);
		return;
	}
	unit_build_dir(argv0, build_dir, sizeof(build_dir));
	snprintf(out, len, "%.*s/test/fakecuda/libfakecuda.so", PATH_MAX - 40, build_dir);
}

/* Ranks over loopback TCP. */
static inline void rmah_tcp_env(void)
{
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "20", 1);
}

/*
 * Runs fn on n ranks, ranks + i * size, a thread each, after making h a
 * group of n (handles listed, the barrier set up), and joins them: the
 * first rank's failure (the char array fail_off bytes into a rank), or NULL.
 */
static inline const char *rmah_run(struct rmah_group *h, int n, void *ranks, size_t size,
				   size_t fail_off, void *(*fn)(void *))
{
	pthread_t th[RMAH_MAXR];

	assert_true(n > 0 && n <= RMAH_MAXR);
	h->n = n;
	for (int i = 0; i < n; i++)
		h->hptr[i] = h->handles[i];
	pthread_barrier_init(&h->bar, NULL, (unsigned)n);
	for (int i = 0; i < n; i++)
		assert_int_equal(pthread_create(&th[i], NULL, fn, (char *)ranks + (size_t)i * size), 0);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&h->bar);
	for (int i = 0; i < n; i++) {
		const char *fail = (const char *)ranks + (size_t)i * size + fail_off;

		if (fail[0])
			return fail;
	}
	return NULL;
}
#define RMAH_RUN(h, n, rs, fn)                                                     \
	rmah_run(h, n, rs, sizeof((rs)[0]),                                        \
		 (size_t)((const char *)(rs)[0].fail - (const char *)&(rs)[0]), fn)

/*
 * Tests req until done or wait_ns passed (yielding between tests if
 * yield): whether it is done; *res is the last test's result (a failed
 * test ends the wait).
 */
static inline int rmah_test_until(ncclResult_t (*test)(void *coll, void *req, int *done),
				  void *coll, void *req, uint64_t wait_ns, int yield,
				  ncclResult_t *res)
{
	uint64_t until = rmah_now_ns() + wait_ns;
	int done = 0;

	do {
		*res = test(coll, req, &done);
		if (yield && *res == ncclSuccess && !done)
			sched_yield();	/* more ranks than cores: let the others run */
	} while (*res == ncclSuccess && !done && rmah_now_ns() < until);
	return done;
}

/* Polls the word w until it reaches want (yielding): 0 if wait_ns passed first. */
static inline int rmah_wait_word(const uint64_t *w, uint64_t want, uint64_t wait_ns)
{
	uint64_t until = rmah_now_ns() + wait_ns;

	while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < want) {
		if (rmah_now_ns() > until)
			return 0;
		sched_yield();
	}
	return 1;
}

/* Puts the ranks' collComms logged at close as striped over lanes ("N puts (... striped over"), summed. */
static inline unsigned long rmah_striped_logged(void)
{
	unsigned long sum = 0, k;

	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n; i++) {
		const char *t = strstr(unit_log_rec.lines[i].text, "): ");

		if (strstr(unit_log_rec.lines[i].text, "striped over") && t &&
		    sscanf(t + 3, "%lu puts", &k) == 1)
			sum += k;
	}
	pthread_mutex_unlock(&unit_log_mu);
	return sum;
}

#endif
