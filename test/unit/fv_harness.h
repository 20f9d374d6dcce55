/*
 * nccl-net-rail unit tests: the harness for tests on the fake verbs
 * provider (test/fakeverbs/), for test files that also run plugin threads
 * (the async event thread) or threads of their own: the captured log is
 * locked, and the fake's run-time controls (fv_test_*) are looked up.
 * Include after unit.h in one test file.
 *
 *   struct fvh *F = fvh_start(conf);      the plugin on these devices
 *   fvh_connect(F, 0, 0, -1);             a send + receive comm, polled here
 *   fvh_wait_log(RAIL_LOG_WARN, "went down", NULL, 5000);
 *   fvh_stop(F);
 */
#ifndef RAIL_FV_HARNESS_H
#define RAIL_FV_HARNESS_H

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

#define FVH_ABI 12
#define FVH_LINE 1024
#define FVH_LOG_MAX 512

struct fvh {
	char dir[64];
	char conf[96], log[96];
	void *ctx;
	int ndev;
	void *lc, *sc, *rc;
	void *lc2;		/* a second listener of a test, closed by fvh_stop */
	uint8_t handle[RAIL_HANDLE_SIZE];	/* lc's */
	void *lib;		/* the fake, as the plugin loaded it */
	int (*event)(const char *dev, int port, int type);
	int (*set_gid)(const char *dev, int port, int index, const char *addr, int type);
	int (*port_state)(const char *dev, int port, int state);
	int (*hold)(const char *dev, int on);	/* fv_test_hold: sends held in flight */
	int (*qp_fatal)(const char *dev);	/* fv_test_qp_fatal: a QP of dev fails */
	/* fv_test_modify_fail: the next count ibv_modify_qp to state on dev fail with err */
	int (*modify_fail)(const char *dev, int state, int err, int count);
	/* fv_test_port_speed: a port's speed changes, with DEVICE_SPEED_CHANGE if event */
	int (*port_speed)(const char *dev, int port, unsigned speed, int width, long port_speed,
			  int event);
	/* fv_test_mem: what the process holds now, one of FVH_MEM_* (fv.h's FV_MEM_*, in order) */
	long long (*mem)(int what);
};
enum { FVH_MEM_MRS, FVH_MEM_MR_BYTES, FVH_MEM_MR_PINNED, FVH_MEM_QPS, FVH_MEM_QP_BYTES,
       FVH_MEM_CQS, FVH_MEM_CQ_BYTES, FVH_MEM_N };

static char fvh_lib[PATH_MAX];
static struct fvh fvh_one;
static int fvh_live;

/* ---- a captured log that plugin threads may write ------------------------ */

static pthread_mutex_t fvh_log_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int n;
	struct {
		int level;
		char text[FVH_LINE];
	} l[FVH_LOG_MAX];
} fvh_logs;

static inline void fvh_sink(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		     const char *fmt, ...)
{
	char text[FVH_LINE];
	va_list ap;

	(void)flags;
	(void)file;
	(void)line;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (getenv("RAIL_TEST_VERBOSE"))
		fprintf(stderr, "[log %d] %s\n", (int)level, text);
	pthread_mutex_lock(&fvh_log_lock);
	if (fvh_logs.n < FVH_LOG_MAX) {
		fvh_logs.l[fvh_logs.n].level = (int)level;
		memcpy(fvh_logs.l[fvh_logs.n].text, text, sizeof(text));
		fvh_logs.n++;
	}
	pthread_mutex_unlock(&fvh_log_lock);
}

/* Lines at this level containing a and b (NULL: any), from line `from` on. */
static inline int fvh_log_count_from(int from, int level, const char *a, const char *b)
{
	int n = 0;

	pthread_mutex_lock(&fvh_log_lock);
	for (int i = from; i < fvh_logs.n; i++)
		if (fvh_logs.l[i].level == level && (!a || strstr(fvh_logs.l[i].text, a)) &&
		    (!b || strstr(fvh_logs.l[i].text, b)))
			n++;
	pthread_mutex_unlock(&fvh_log_lock);
	return n;
}

static inline int fvh_log_count(int level, const char *a, const char *b)
{
	return fvh_log_count_from(0, level, a, b);
}

static inline int fvh_log_mark(void)
{
	int n;

	pthread_mutex_lock(&fvh_log_lock);
	n = fvh_logs.n;
	pthread_mutex_unlock(&fvh_log_lock);
	return n;
}

static inline void fvh_log_dump(void)
{
	pthread_mutex_lock(&fvh_log_lock);
	for (int i = 0; i < fvh_logs.n; i++)
		print_message("[log %d] %s\n", fvh_logs.l[i].level, fvh_logs.l[i].text);
	pthread_mutex_unlock(&fvh_log_lock);
}

/* Wait up to ms for a line from `from` on (the async thread logs what it did). */
static inline int fvh_wait_log_from(int from, int level, const char *a, const char *b, int ms)
{
	for (int i = 0; i <= ms; i++) {
		if (fvh_log_count_from(from, level, a, b))
			return 1;
		usleep(1000);
	}
	return 0;
}

/* ---- the fake ------------------------------------------------------------- */

static inline int fvh_find_lib(void)
{
	const char *env = getenv("RAIL_FAKEVERBS_LIB");
	char exe[PATH_MAX];
	ssize_t n;

	if (env && env[0]) {
		snprintf(fvh_lib, sizeof(fvh_lib), "%s", env);
		return access(fvh_lib, R_OK) == 0;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return 0;
	exe[n] = '\0';
	*strrchr(exe, '/') = '\0';
	snprintf(fvh_lib, sizeof(fvh_lib), "%.4000s/../fakeverbs/libfakeverbs.so", exe);
	return access(fvh_lib, R_OK) == 0;
}

static inline void fvh_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* The plugin loads the fake libibverbs (fvh_lib) and the fake libmlx5 beside it, never the host's. */
static inline void fvh_use_fake_libs(void)
{
	char mlx5[PATH_MAX];
	const char *slash = strrchr(fvh_lib, '/');

	setenv("NCCL_IBVERBS_LIB", fvh_lib, 1);
	snprintf(mlx5, sizeof(mlx5), "%.*s/libfakemlx5.so", slash ? (int)(slash - fvh_lib) : 1,
		 slash ? fvh_lib : ".");
	setenv("NCCL_RAIL_MLX5_LIB", mlx5, 1);
}

/*
 * The plugin on the devices of conf; files: NULL, or pairs of a sysfs path
 * ("/sys/module/nvidia_peermem/version") and its text, NULL-ended, written
 * under the fake's sysfs root before init (peermem present, say).
 */
static inline struct fvh *fvh_start_with(const char *conf, const char *const *files)
{
	struct fvh *F = &fvh_one;
	const char *tmp = getenv("RAIL_FAKEVERBS_TMPDIR");	/* default /tmp; tmpfs is faster */

	memset(F, 0, sizeof(*F));
	snprintf(F->dir, sizeof(F->dir), "%.36s/rail-fakeverbs-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
	assert_non_null(mkdtemp(F->dir));
	snprintf(F->conf, sizeof(F->conf), "%.60s/devices.conf", F->dir);
	snprintf(F->log, sizeof(F->log), "%.60s/verbs.log", F->dir);
	fvh_write_file(F->conf, conf);
	for (int i = 0; files && files[i]; i += 2) {
		char path[PATH_MAX], cmd[PATH_MAX + 32];

		snprintf(path, sizeof(path), "%s%s", F->dir, files[i]);
		snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", path);
		assert_int_equal(system(cmd), 0);
		fvh_write_file(path, files[i + 1]);
	}
	fvh_use_fake_libs();
	setenv("RAIL_FAKEVERBS_CONF", F->conf, 1);
	setenv("RAIL_FAKEVERBS_LOG", F->log, 1);
	setenv("RAIL_FAKEVERBS_SYSFS", F->dir, 1);
	setenv("NCCL_RAIL_SYSFS_ROOT", F->dir, 1);
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	rail_sysfs_set_root(F->dir);
	pthread_mutex_lock(&fvh_log_lock);
	fvh_logs.n = 0;
	pthread_mutex_unlock(&fvh_log_lock);
	rail_log_set_logger((rail_logger_fn)fvh_sink);
	fvh_live = 1;
	assert_int_equal(rail_net_init(&F->ctx, 1, -1, NULL, FVH_ABI), ncclSuccess);
	assert_int_equal(rail_net_devices(&F->ndev), ncclSuccess);
	F->lib = dlopen(fvh_lib, RTLD_NOW | RTLD_NOLOAD);
	assert_non_null(F->lib);
	*(void **)&F->event = dlsym(F->lib, "fv_test_event");
	*(void **)&F->set_gid = dlsym(F->lib, "fv_test_set_gid");
	*(void **)&F->port_state = dlsym(F->lib, "fv_test_port_state");
	*(void **)&F->hold = dlsym(F->lib, "fv_test_hold");
	*(void **)&F->qp_fatal = dlsym(F->lib, "fv_test_qp_fatal");
	*(void **)&F->modify_fail = dlsym(F->lib, "fv_test_modify_fail");
	*(void **)&F->port_speed = dlsym(F->lib, "fv_test_port_speed");
	*(void **)&F->mem = dlsym(F->lib, "fv_test_mem");
	if (!F->event || !F->set_gid || !F->port_state || !F->hold)
		fail_msg("%s lacks the fv_test_* controls: rebuild it (make tests)", fvh_lib);
	return F;
}

static inline struct fvh *fvh_start(const char *conf)
{
	return fvh_start_with(conf, NULL);
}

static inline void fvh_close_comms(struct fvh *F)
{
	int bad = 0;

	bad |= F->sc && rail_net_close_send(F->sc) != ncclSuccess;
	bad |= F->rc && rail_net_close_recv(F->rc) != ncclSuccess;
	bad |= F->lc && rail_net_close_listen(F->lc) != ncclSuccess;
	F->sc = F->rc = F->lc = NULL;
	if (bad)
		fail_msg("closing the comms failed");
}

static inline void fvh_stop(struct fvh *F)
{
	char cmd[128];
	int bad = 0;

	fvh_live = 0;
	bad |= F->sc && rail_net_close_send(F->sc) != ncclSuccess;
	bad |= F->rc && rail_net_close_recv(F->rc) != ncclSuccess;
	bad |= F->lc && rail_net_close_listen(F->lc) != ncclSuccess;
	bad |= F->lc2 && rail_net_close_listen(F->lc2) != ncclSuccess;
	F->sc = F->rc = F->lc = F->lc2 = NULL;
	bad |= F->ctx && rail_net_finalize(F->ctx) != ncclSuccess;
	if (F->lib)
		dlclose(F->lib);
	rail_log_set_logger(NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", F->dir);
	if (getenv("RAIL_FAKEVERBS_KEEP"))
		print_message("kept %s\n", F->dir);
	else if (system(cmd) != 0)
		print_message("could not remove %s\n", F->dir);
	rail_params_reload();
	if (bad)
		fail_msg("closing the comms or finalizing failed");
}

static inline int fvh_teardown(void **state)
{
	(void)state;
	if (fvh_live)
		fvh_stop(&fvh_one);
	return 0;
}

/*
 * Listen on dev_recv (unless F->lc is open: then F->handle is its handle)
 * and connect from dev_send, both polled here until both comms exist or
 * each side is done: a side that failed is not called again, and the other
 * is driven to its own end (a connector notices the closed socket; a
 * listener whose connector failed early is polled 200 ms more), so nothing
 * stays half open. Results in *lr, *cr, *ar; returns 1 when both comms exist.
 */
static inline int fvh_try_connect(struct fvh *F, int dev_recv, int dev_send, int tc,
				  ncclResult_t *lr, ncclResult_t *cr, ncclResult_t *ar)
{
	uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull, grace = 0;

	*lr = *cr = *ar = ncclSuccess;
	if (!F->lc) {
		*lr = rail_net_listen(F->ctx, dev_recv, F->handle, &F->lc);
		if (*lr != ncclSuccess)
			return 0;
	}
	while (rail_now_ns() < deadline) {
		int cdone = F->sc || *cr != ncclSuccess, adone = F->rc || *ar != ncclSuccess;

		if (cdone && adone)
			break;
		if (!cdone)
			*cr = rail_net_connect(F->ctx, dev_send, tc, F->handle, &F->sc);
		if (adone)
			continue;
		if (*cr != ncclSuccess) {
			if (!grace)
				grace = rail_now_ns() + 200000000ull;
			if (rail_now_ns() > grace)
				break;
		}
		*ar = rail_net_accept(F->lc, &F->rc);
	}
	return F->sc && F->rc;
}

static inline void fvh_connect(struct fvh *F, int dev_recv, int dev_send, int tc)
{
	ncclResult_t lr, cr, ar;

	if (!fvh_try_connect(F, dev_recv, dev_send, tc, &lr, &cr, &ar)) {
		fvh_log_dump();
		fail_msg("connection on the fake devices failed (listen %d, connect %d, accept %d)",
			 lr, cr, ar);
	}
}

/* ---- the fake's call log -------------------------------------------------- */

/* One 4 KiB message from F->sc to F->rc with tag, every byte checked; both registrations dropped after. */
static inline void fvh_one_message(struct fvh *F, int tag)
{
	static unsigned char sbuf[4096], rbuf[4096];
	void *smh, *rmh, *sreq = NULL, *rreq = NULL, *data[1] = { rbuf }, *mhs[1];
	size_t sizes[1] = { sizeof(rbuf) };
	int tags[1] = { tag }, sdone = 0, rdone = 0, got[1] = { -1 };
	uint64_t end = rail_now_ns() + 10000000000ull;

	for (size_t i = 0; i < sizeof(sbuf); i++)
		sbuf[i] = (unsigned char)(i * 7 + 3);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	while (!rreq)
		assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), ncclSuccess);
	while (!sreq)
		assert_int_equal(rail_net_isend(F->sc, sbuf, sizeof(sbuf), tag, smh, &sreq),
				 ncclSuccess);
	while ((!sdone || !rdone) && rail_now_ns() < end) {
		if (!sdone)
			assert_int_equal(rail_net_test(sreq, &sdone, NULL), ncclSuccess);
		if (!rdone)
			assert_int_equal(rail_net_test(rreq, &rdone, got), ncclSuccess);
	}
	assert_true(sdone && rdone);
	assert_int_equal(got[0], (int)sizeof(sbuf));
	assert_memory_equal(rbuf, sbuf, sizeof(sbuf));
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
}

/* Lines of the call log from line `from` (0-based) starting with call, containing n1 and n2. */
static inline int fvh_calls(const struct fvh *F, int from, const char *call, const char *n1,
		     const char *n2, char *last)
{
	FILE *f = fopen(F->log, "r");
	char line[FVH_LINE];
	size_t cl = strlen(call);
	int n = 0, i = 0;

	if (!f)
		return 0;
	for (; fgets(line, sizeof(line), f); i++) {
		if (i < from || strncmp(line, call, cl) || line[cl] != ' ')
			continue;
		if ((n1 && !strstr(line, n1)) || (n2 && !strstr(line, n2)))
			continue;
		n++;
		if (last) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(last, FVH_LINE, "%s", line);
		}
	}
	fclose(f);
	return n;
}

/* Lines in the call log so far (a mark for fvh_calls). */
static inline int fvh_calls_mark(const struct fvh *F)
{
	FILE *f = fopen(F->log, "r");
	char line[FVH_LINE];
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n++;
	fclose(f);
	return n;
}

/* The value of " key=" in a log line; fails the test if absent. */
static inline const char *fvh_kv(const char *line, const char *key, char *buf, size_t len)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), " %s=", key);
	p = strstr(line, pat);
	if (!p)
		fail_msg("no %s in: %s", key, line);
	p += strlen(pat);
	snprintf(buf, len, "%.*s", (int)strcspn(p, " \""), p);
	return buf;
}

#endif
