/* nccl-net-rail unit tests: RLIMIT_NOFILE raised at init and named in errors (src/fdlimit.c). */
#include "unit.h"

#include <sys/resource.h>

#include "api.h"
#include "fdlimit.h"
#include "handle.h"
#include "param.h"
#include "rail.h"

static struct rlimit saved;

static int setup(void **state)
{
	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unsetenv("NCCL_RAIL_RAISE_NOFILE");
	rail_params_reload();
	return setrlimit(RLIMIT_NOFILE, &saved);
}

/* The soft limit as many containers start: 256 here, under the hard limit. */
static void lower_soft(rlim_t soft)
{
	struct rlimit rl = saved;

	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max <= soft)
		skip();	/* nothing to raise on this machine: its hard limit is that low */
	rl.rlim_cur = soft;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

/* Init raises the soft limit to the hard one and says so once. */
static void test_raised_to_hard(void **state)
{
	struct rlimit rl;

	(void)state;
	lower_soft(256);
	rail_params_reload();
	unit_log_capture();
	assert_int_equal(rail_nofile_raise(), 0);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	assert_true(rl.rlim_cur > 256);
	if (saved.rlim_max != RLIM_INFINITY)
		assert_true(rl.rlim_cur == saved.rlim_max);
	assert_int_equal(unit_log_count2(RAIL_LOG_INFO, "RLIMIT_NOFILE", "raised from 256"), 1);
	/* again: nothing to do, nothing said */
	assert_int_equal(rail_nofile_raise(), 0);
	assert_int_equal(unit_log_count2(RAIL_LOG_INFO, "RLIMIT_NOFILE", "raised"), 1);
	unit_log_release();
}

/* The plugin's init does it (NCCL's first call in every process). */
static void test_init_raises(void **state)
{
	struct rlimit rl;
	void *ctx = NULL;

	(void)state;
	lower_soft(256);
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	assert_true(rl.rlim_cur > 256);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unsetenv("NCCL_RAIL_TRANSPORT");
	unsetenv("NCCL_SOCKET_IFNAME");
}

/*
 * At the limit, a TCP connection fails at once (not after
 * NCCL_RAIL_CONNECT_TIMEOUT), with a WARN naming RLIMIT_NOFILE. Both sides
 * are in this process, so whichever side finds no descriptor first says
 * so; before, the accepting side waited 300 s and the connector's WARN
 * said only "Too many open files".
 */
static void test_tcp_at_limit_fails_fast(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
	ncclResult_t cr = ncclSuccess, ar = ncclSuccess;
	long soft, hard, open;
	uint64_t t0;

	(void)state;
	setenv("NCCL_RAIL_RAISE_NOFILE", "0", 1);
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	assert_int_equal(rail_nofile_state(&soft, &hard, &open), 0);
	/* Room for 1 socket: the connector's control socket (its data sockets open later). */
	lower_soft((rlim_t)open + 1);
	unit_log_capture();
	t0 = rail_now_ns();
	while (cr == ncclSuccess && ar == ncclSuccess && rail_now_ns() - t0 < 20000000000ull) {
		if (!sc)
			cr = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (!rc)
			ar = rail_net_accept(lc, &rc);
		if (sc && rc)
			break;
	}
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
	if (cr == ncclSuccess && ar == ncclSuccess) {
		unit_log_dump();
		fail_msg("neither side failed in %.1f s at the descriptor limit",
			 (rail_now_ns() - t0) / 1e9);
	}
	assert_true(rail_now_ns() - t0 < 5000000000ull);
	assert_true(unit_log_has(RAIL_LOG_WARN, "RLIMIT_NOFILE soft limit"));
	unit_log_release();
	if (sc)
		rail_net_close_send(sc);
	if (rc)
		rail_net_close_recv(rc);
	rail_net_close_listen(lc);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unsetenv("NCCL_RAIL_TRANSPORT");
	unsetenv("NCCL_SOCKET_IFNAME");
}

/* NCCL_RAIL_RAISE_NOFILE=0 leaves the limit as it is. */
static void test_off_leaves_it(void **state)
{
	struct rlimit rl;

	(void)state;
	lower_soft(256);
	setenv("NCCL_RAIL_RAISE_NOFILE", "0", 1);
	rail_params_reload();
	unit_log_capture();
	assert_int_equal(rail_nofile_raise(), 0);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	assert_int_equal(rl.rlim_cur, 256);
	assert_false(unit_log_has(RAIL_LOG_INFO, "RLIMIT_NOFILE"));
	unit_log_release();
}

/* The hint names the limit, the count open and the fix. */
static void test_hint_names_limit(void **state)
{
	char buf[512], want[64];
	long soft, hard, open;

	(void)state;
	lower_soft(200);
	assert_int_equal(rail_nofile_state(&soft, &hard, &open), 0);
	assert_int_equal(soft, 200);
	assert_true(open >= 3 && open < 200);
	rail_nofile_hint(buf, sizeof(buf));
	snprintf(want, sizeof(want), "RLIMIT_NOFILE soft limit 200");
	assert_non_null(strstr(buf, want));
	assert_non_null(strstr(buf, "ulimit -n"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_raised_to_hard, teardown),
		cmocka_unit_test_teardown(test_init_raises, teardown),
		cmocka_unit_test_teardown(test_off_leaves_it, teardown),
		cmocka_unit_test_teardown(test_tcp_at_limit_fails_fast, teardown),
		cmocka_unit_test_teardown(test_hint_names_limit, teardown),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
