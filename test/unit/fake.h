/*
 * nccl-net-rail unit tests: running the plugin on the fake verbs provider
 * (test/fakeverbs/). Include after unit.h, in one file per binary.
 *
 *   F = fake_start("device mlx5_0\nport 1 link=ib lid=3\ngid 0 fe80::1\n");
 *   fake_connect(F, 0, 0, -1);            send comm F->sc, receive comm F->rc
 *   fake_xfer(F, sbuf, smh, 65536, rbuf, rmh, 65536, 7);
 *   log_find(F, 0, line, "ibv_post_send", "len=65536", NULL);
 *   fake_stop(F);                          also unsets the variables in fake_vars
 *
 * The library comes from RAIL_FAKEVERBS_LIB (make test-unit sets it), else
 * from next to the test binary (build/test/unit/../fakeverbs/); the fake
 * libmlx5 (NCCL_RAIL_MLX5_LIB, unless the test set it) from beside it.
 */
#ifndef RAIL_TEST_FAKE_H
#define RAIL_TEST_FAKE_H

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

#define FAKE_NET_ABI 12
#define LINE 1024

struct fake {
	char dir[64];
	char conf[96], log[96];
	void *ctx;
	int ndev;
	void *lc, *sc, *rc;
};

static char fake_lib[PATH_MAX];
/* The one started plugin; the teardown finalizes it even after a failed assertion. */
static struct fake fk;
static int fk_live;
/* Variables a test may set; fake_stop unsets them. */
static const char *const fake_vars[] = {
	"NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_AR_THRESHOLD", "NCCL_IB_ECE_ENABLE",
	"NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_RAIL_IB_FLUSH_HOST",
	"NCCL_RAIL_IB_EAGER", "NCCL_IB_SL", "NCCL_IB_PCI_RELAXED_ORDERING",
	"NCCL_RAIL_IB_EAGER_ORDER", "NCCL_RAIL_MLX5_LIB", "NCCL_IB_DATA_DIRECT",
	"NCCL_IB_TC", "NCCL_IB_FIFO_TC", "NCCL_IB_DEVICE_PCI_ORDER", "NCCL_IB_HCA",
	"NCCL_IB_WARN_RAIL_LOCAL",
};

static inline int fake_find_lib(void)
{
	const char *env = getenv("RAIL_FAKEVERBS_LIB");
	char exe[PATH_MAX];
	ssize_t n;

	if (env && env[0]) {
		snprintf(fake_lib, sizeof(fake_lib), "%s", env);
		return access(fake_lib, R_OK) == 0;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return 0;
	exe[n] = '\0';
	*strrchr(exe, '/') = '\0';
	snprintf(fake_lib, sizeof(fake_lib), "%.4000s/../fakeverbs/libfakeverbs.so", exe);
	return access(fake_lib, R_OK) == 0;
}

/* The fake libmlx5 beside the fake libibverbs (test/fakeverbs/mlx5/). */
static inline void fake_mlx5_lib(char *out, size_t len)
{
	const char *slash = strrchr(fake_lib, '/');
	int dir = slash ? (int)(slash - fake_lib) : 1;

	snprintf(out, len, "%.*s/libfakemlx5.so", dir, slash ? fake_lib : ".");
}

static inline void fake_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* The devices `conf` describes and the environment, without starting the plugin. */
static inline struct fake *fake_prepare(const char *conf)
{
	struct fake *F = &fk;

	memset(F, 0, sizeof(*F));
	snprintf(F->dir, sizeof(F->dir), "/tmp/rail-fakeverbs-XXXXXX");
	assert_non_null(mkdtemp(F->dir));
	snprintf(F->conf, sizeof(F->conf), "%.60s/devices.conf", F->dir);
	snprintf(F->log, sizeof(F->log), "%.60s/verbs.log", F->dir);
	fake_write_file(F->conf, conf);
	setenv("NCCL_IBVERBS_LIB", fake_lib, 1);
	if (!getenv("NCCL_RAIL_MLX5_LIB")) {	/* a test may point it elsewhere */
		char mlx5[PATH_MAX];

		fake_mlx5_lib(mlx5, sizeof(mlx5));
		setenv("NCCL_RAIL_MLX5_LIB", mlx5, 1);
	}
	setenv("RAIL_FAKEVERBS_CONF", F->conf, 1);
	setenv("RAIL_FAKEVERBS_LOG", F->log, 1);
	setenv("RAIL_FAKEVERBS_SYSFS", F->dir, 1);
	setenv("NCCL_RAIL_SYSFS_ROOT", F->dir, 1);
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	rail_sysfs_set_root(F->dir);	/* read once per process otherwise */
	unit_log_capture();
	fk_live = 1;
	return F;
}

/* Start the plugin on the devices `conf` describes. */
static inline struct fake *fake_start(const char *conf)
{
	struct fake *F = fake_prepare(conf);

	assert_int_equal(rail_net_init(&F->ctx, 1, -1, NULL, FAKE_NET_ABI), ncclSuccess);
	assert_int_equal(rail_net_devices(&F->ndev), ncclSuccess);
	return F;
}

static inline void fake_stop(struct fake *F)
{
	char cmd[128];
	int bad = 0;

	fk_live = 0;
	bad |= F->sc && rail_net_close_send(F->sc) != ncclSuccess;
	bad |= F->rc && rail_net_close_recv(F->rc) != ncclSuccess;
	bad |= F->lc && rail_net_close_listen(F->lc) != ncclSuccess;
	bad |= F->ctx && rail_net_finalize(F->ctx) != ncclSuccess;
	unit_log_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", F->dir);
	if (getenv("RAIL_FAKEVERBS_KEEP"))
		print_message("kept %s\n", F->dir);
	else if (system(cmd) != 0)
		print_message("could not remove %s\n", F->dir);
	for (size_t i = 0; i < sizeof(fake_vars) / sizeof(fake_vars[0]); i++)
		unsetenv(fake_vars[i]);
	rail_params_reload();
	if (bad)
		fail_msg("closing the comms or finalizing failed");
}

static inline int fake_teardown(void **state)
{
	(void)state;
	if (fk_live)
		fake_stop(&fk);
	return 0;
}

/* Connect a send comm on dev_send to a listener on dev_recv, both polled here. */
static inline void fake_connect(struct fake *F, int dev_recv, int dev_send, int tc)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull;
	ncclResult_t cr = ncclSuccess, ar = ncclSuccess;

	assert_int_equal(rail_net_listen(F->ctx, dev_recv, handle, &F->lc), ncclSuccess);
	while ((!F->sc || !F->rc) && rail_now_ns() < deadline) {
		if (!F->sc && cr == ncclSuccess)
			cr = rail_net_connect(F->ctx, dev_send, tc, handle, &F->sc);
		if (!F->rc && ar == ncclSuccess)
			ar = rail_net_accept(F->lc, &F->rc);
		if (cr != ncclSuccess || ar != ncclSuccess)
			break;
	}
	if (!F->sc || !F->rc) {
		unit_log_dump();
		fail_msg("connection on the fake devices failed (connect %d, accept %d)", cr, ar);
	}
}

/* One message of size bytes into a receive of rsize bytes; both complete; the received size. */
static inline size_t fake_xfer(struct fake *F, void *sbuf, void *smh, size_t size, void *rbuf,
			       void *rmh, size_t rsize, int tag)
{
	void *sreq = NULL, *rreq = NULL, *data[1] = { rbuf }, *mhs[1] = { rmh };
	size_t sizes[1] = { rsize };
	int tags[1] = { tag }, rdone = 0, sdone = 0, got[1] = { -1 };
	uint64_t deadline = rail_now_ns() + 10ull * 1000000000ull;

	/* Both sides progress in turn, as two processes would. */
	while ((!rdone || !sdone) && rail_now_ns() < deadline) {
		if (!rreq)
			assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq),
					 ncclSuccess);
		if (!sreq)
			assert_int_equal(rail_net_isend(F->sc, sbuf, size, tag, smh, &sreq),
					 ncclSuccess);
		if (rreq && !rdone)
			assert_int_equal(rail_net_test(rreq, &rdone, got), ncclSuccess);
		if (sreq && !sdone)
			assert_int_equal(rail_net_test(sreq, &sdone, NULL), ncclSuccess);
	}
	assert_true(rdone);
	assert_true(sdone);
	return (size_t)got[0];
}

/* ---- the call log ------------------------------------------------------- */

/*
 * The n-th (from 0) log line starting with call and containing every needle
 * (NULL: none); 0 if none. With next, the line after it instead (any call).
 */
static inline int log_find_ex(const struct fake *F, int n, char *out, const char *call,
			      const char *n1, const char *n2, int next)
{
	FILE *f = fopen(F->log, "r");
	char line[LINE];
	size_t cl = strlen(call);

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, call, cl) || line[cl] != ' ')
			continue;
		if ((n1 && !strstr(line, n1)) || (n2 && !strstr(line, n2)))
			continue;
		if (n-- == 0) {
			int ok = !next || fgets(line, sizeof(line), f);

			line[strcspn(line, "\n")] = '\0';
			snprintf(out, LINE, "%s", line);
			fclose(f);
			return ok;
		}
	}
	fclose(f);
	return 0;
}

static inline int log_find(const struct fake *F, int n, char *out, const char *call,
			   const char *n1, const char *n2)
{
	return log_find_ex(F, n, out, call, n1, n2, 0);
}

static inline int log_count(const struct fake *F, const char *call, const char *n1,
			    const char *n2)
{
	char line[LINE];
	int n = 0;

	while (log_find(F, n, line, call, n1, n2))
		n++;
	return n;
}

/* The value of " key=" in a log line; fails the test if absent. */
static inline const char *kv(const char *line, const char *key, char *buf, size_t len)
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

static inline long long kvnum(const char *line, const char *key)
{
	char buf[128];

	return strtoll(kv(line, key, buf, sizeof(buf)), NULL, 0);
}

#endif
