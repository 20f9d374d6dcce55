/* nccl-net-rail unit tests: RLIMIT_NOFILE raised at init and named in errors (src/fdlimit.c). */
#include "unit.h"

#include <sys/resource.h>

#include "api.h"
#include "fdlimit.h"
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
		cmocka_unit_test_teardown(test_hint_names_limit, teardown),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
