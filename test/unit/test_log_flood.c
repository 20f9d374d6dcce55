/*
 * nccl-net-rail unit tests: a line a flood repeats is a WARN once a minute
 * and INFO otherwise (rail_log_flood, src/log.c), as the TCP listener logs
 * the stray connections it refuses.
 */
#include "unit.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "rail.h"

#define S 1000000000ull

static void test_flood_levels(void **state)
{
	struct rail_log_flood f = { 0 };
	unsigned long before = 99;

	(void)state;
	assert_int_equal(rail_log_flood(&f, 5 * S, &before), RAIL_LOG_WARN);
	assert_int_equal(before, 0);
	for (int i = 1; i < 10; i++) {
		assert_int_equal(rail_log_flood(&f, 5 * S + i * S, &before), RAIL_LOG_INFO);
		assert_int_equal(before, 0);
	}
	/* a minute after the first: WARN again, saying 9 went at INFO */
	assert_int_equal(rail_log_flood(&f, 65 * S, &before), RAIL_LOG_WARN);
	assert_int_equal(before, 9);
	assert_int_equal(rail_log_flood(&f, 66 * S, &before), RAIL_LOG_INFO);
	/* a quiet hour, then one: a WARN, with the one INFO of its minute */
	assert_int_equal(rail_log_flood(&f, 4000 * S, &before), RAIL_LOG_WARN);
	assert_int_equal(before, 1);
}

/* One garbage connection: 64 bytes that are no hello, then closed. */
static void stray(const union rail_sockaddr *to)
{
	uint8_t junk[64];
	int fd = socket(to->sa.sa_family, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	memset(junk, 0x5a, sizeof(junk));
	assert_int_equal(connect(fd, &to->sa, rail_sockaddr_len(to)), 0);
	assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	close(fd);
}

/*
 * 30 strays that send garbage to a TCP listener: one WARN (the first), the
 * other 29 refusals at INFO; before, each was a WARN (a flood of 2,000 a
 * second gave hundreds of WARN lines).
 */
static void test_tcp_strays_one_warn(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	struct rail_handle h;
	void *ctx = NULL, *lc = NULL, *rc = NULL;
	uint64_t t0;

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	char why[128];

	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	unit_log_capture();
	for (int i = 0; i < 30; i++)
		stray(&h.addr);
	t0 = rail_now_ns();
	while (unit_log_count(RAIL_LOG_WARN, "refusing a connection") +
		       unit_log_count(RAIL_LOG_INFO, "refusing a connection") < 30 &&
	       rail_now_ns() - t0 < 10 * S)
		assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	assert_null(rc);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "refusing a connection"), 1);
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "refusing a connection"), 29);
	unit_log_release();
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unsetenv("NCCL_RAIL_TRANSPORT");
	unsetenv("NCCL_SOCKET_IFNAME");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flood_levels),
		cmocka_unit_test(test_tcp_strays_one_warn),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
