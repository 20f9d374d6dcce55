/*
 * nccl-net-rail unit tests: stray connections at a verbs listener
 * (issue 11, item 3), on the fake verbs provider (test/fakeverbs/). A
 * connection that closes at once, one that sends garbage, one that stays
 * idle, and more idle ones than the listener keeps pending must neither
 * fail accept() nor keep the real peer waiting; and many real peers
 * connecting at once (more than the listener keeps pending) are all
 * accepted, none taken for a stray.
 *
 * The library comes from RAIL_FAKEVERBS_LIB (make test-unit sets it), else
 * from next to this binary (build/test/unit/../fakeverbs/).
 */
#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

#define NET_ABI 12
#define IDLE_STRAYS 136	/* more than the listener keeps pending (128) */
#define REAL_PEERS 160

static char fake_lib[PATH_MAX];
static char dir[64];
static void *ctx, *lc, *sc, *rc;
static void *scs[REAL_PEERS], *rcs[REAL_PEERS];
static uint8_t handles[REAL_PEERS][RAIL_HANDLE_SIZE];
static int strays[IDLE_STRAYS + 8];
static int nstrays;

static const char roce_dev[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

static int find_lib(void)
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

static int setup(void **state)
{
	char path[128];
	FILE *f;
	int ndev = 0;

	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/rail-ibaccept-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/devices.conf", dir);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(roce_dev, f);
	fclose(f);
	setenv("NCCL_IBVERBS_LIB", fake_lib, 1);
	setenv("RAIL_FAKEVERBS_CONF", path, 1);
	snprintf(path, sizeof(path), "%s/verbs.log", dir);
	setenv("RAIL_FAKEVERBS_LOG", path, 1);
	setenv("RAIL_FAKEVERBS_SYSFS", dir, 1);
	setenv("NCCL_RAIL_SYSFS_ROOT", dir, 1);
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	rail_sysfs_set_root(dir);
	unit_log_capture();
	if (rail_net_init(&ctx, 1, -1, NULL, NET_ABI) != ncclSuccess ||
	    rail_net_devices(&ndev) != ncclSuccess || ndev < 1)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	for (int i = 0; i < nstrays; i++)
		close(strays[i]);
	nstrays = 0;
	if (sc)
		rail_net_close_send(sc);
	if (rc)
		rail_net_close_recv(rc);
	for (int i = 0; i < REAL_PEERS; i++) {
		if (scs[i])
			rail_net_close_send(scs[i]);
		if (rcs[i])
			rail_net_close_recv(rcs[i]);
		scs[i] = rcs[i] = NULL;
	}
	sc = rc = NULL;
	if (lc)
		rail_net_close_listen(lc);
	if (ctx)
		rail_net_finalize(ctx);
	lc = ctx = NULL;
	unit_log_release();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		print_message("could not remove %s\n", dir);
	return 0;
}

/* A blocking TCP connection to the listener (the kernel completes it from the backlog). */
static int stray_connect(const union rail_sockaddr *addr)
{
	int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, &addr->sa, rail_sockaddr_len(addr)), 0);
	return fd;
}

/* accept() a few times: it must not fail, and hands out nothing. */
static void accept_nothing(int calls)
{
	for (int i = 0; i < calls; i++) {
		void *c = NULL;

		assert_int_equal(rail_net_accept(lc, &c), ncclSuccess);
		assert_null(c);
		usleep(2000);
	}
}

/*
 * Strays of every kind, then the real peer, while strays stay connected:
 * accept() returns the real peer's comm within 10 s and never fails.
 */
static void test_strays_then_real_peer(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE], junk[300];
	struct rail_handle h;
	char why[128];
	uint64_t deadline;
	ncclResult_t cr = ncclSuccess, ar = ncclSuccess;
	int fd;

	(void)state;
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	/* Connect and close at once (a health check, a port scanner). */
	for (int i = 0; i < 3; i++)
		close(stray_connect(&h.addr));
	accept_nothing(5);
	/* A peer that resets the connection (SO_LINGER 0). */
	fd = stray_connect(&h.addr);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &(struct linger){ 1, 0 }, sizeof(struct linger));
	close(fd);
	accept_nothing(5);
	/* Garbage bytes (another program's protocol). */
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	fd = stray_connect(&h.addr);
	assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	strays[nstrays++] = fd;
	accept_nothing(5);
	/* Idle clients, more than the listener keeps pending; they stay connected. */
	for (int i = 0; i < IDLE_STRAYS; i++) {
		strays[nstrays++] = stray_connect(&h.addr);
		if (i % 8 == 7)
			accept_nothing(1);
	}
	accept_nothing(5);
	/* The real peer (the oldest strays become droppable after 2 s). */
	deadline = rail_now_ns() + 10ull * 1000000000ull;
	while ((!sc || !rc) && rail_now_ns() < deadline) {
		if (!sc && cr == ncclSuccess)
			cr = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (!rc && ar == ncclSuccess)
			ar = rail_net_accept(lc, &rc);
		if (cr != ncclSuccess || ar != ncclSuccess)
			break;
		usleep(1000);
	}
	if (ar != ncclSuccess || !rc) {
		unit_log_dump();
		fail_msg("with strays at the listener, accept %s (connect %d): the real peer %s",
			 ar != ncclSuccess ? "failed" : "never returned a comm", cr,
			 ar != ncclSuccess ? "was never accepted" : "starved for 10 s");
	}
	assert_non_null(sc);
}

/*
 * REAL_PEERS connections to one listener at once, each connect called in
 * turn (as NCCL's proxy does): the listener must keep those whose hello has
 * not come yet, however many, and accept every one.
 */
static void test_many_real_peers(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull;
	int nsc = 0, nrc = 0;

	(void)state;
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	for (int i = 0; i < REAL_PEERS; i++)
		memcpy(handles[i], handle, sizeof(handle));
	/* Start every connect before the listener looks at any. */
	for (int i = 0; i < REAL_PEERS; i++)
		assert_int_equal(rail_net_connect(ctx, 0, -1, handles[i], &scs[i]), ncclSuccess);
	while ((nsc < REAL_PEERS || nrc < REAL_PEERS) && rail_now_ns() < deadline) {
		void *c = NULL;
		ncclResult_t r = rail_net_accept(lc, &c);

		if (r != ncclSuccess) {
			unit_log_dump();
			fail_msg("accept failed after %d of %d real peers", nrc, REAL_PEERS);
		}
		if (c)
			rcs[nrc++] = c;
		nsc = 0;
		for (int i = 0; i < REAL_PEERS; i++) {
			if (!scs[i] && rail_net_connect(ctx, 0, -1, handles[i], &scs[i]) !=
					       ncclSuccess) {
				unit_log_dump();
				fail_msg("connect #%d failed (the listener dropped it?)", i);
			}
			nsc += scs[i] != NULL;
		}
	}
	if (nsc < REAL_PEERS || nrc < REAL_PEERS)
		fail_msg("%d of %d connects and %d accepts completed in 30 s", nsc, REAL_PEERS, nrc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_strays_then_real_peer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_real_peers, setup, teardown),
	};

	if (!find_lib()) {
		print_message("SKIP: the fake verbs library %s is missing (make tests builds it)\n",
			      fake_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
