/*
 * The TCP listener's pending list under a flood of idle strays (a port
 * scanner, health checks): a real connector whose hello comes late (a
 * loaded host) is never dropped to make room for strays younger than the
 * stray grace; the newcomers beyond the bound are closed instead, and that
 * is logged (rate-limited).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/socket.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "rail.h"
#include "tcp/tcp.h"
#include "unit.h"

#define NSTRAYS 200	/* more than the listener keeps pending (128) */

static int raw_connect(const union rail_sockaddr *addr)
{
	int fd = socket(addr->sa.sa_family, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, &addr->sa, sizeof(*addr)), 0);
	return fd;
}

static void send_all(int fd, const uint8_t *buf, size_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		assert_true(n > 0);
		buf += n;
		len -= (size_t)n;
	}
}

/* The hello bytes a real connector of one data socket sends on socket index. */
static size_t real_hello(const struct rail_handle *h, uint64_t conn_id, int index, uint8_t *out)
{
	struct tcp_hello hello = { .index = (uint16_t)index, .nonce = h->nonce,
				   .conn_id = conn_id, .nsocks = 1, .nthreads = 1,
				   .inline_max = TCP_INLINE_DEFAULT, .min_chunk = 65536 };
	struct tcp_rescue none;

	tcp_hello_encode(&hello, out);
	if (index)
		return TCP_HELLO_SIZE;
	memset(&none, 0, sizeof(none));
	assert_int_equal(rail_random_bytes(none.share, sizeof(none.share)), 0);
	tcp_rescue_encode(&none, out + TCP_HELLO_SIZE);
	return TCP_HELLO_SIZE + TCP_RESCUE_SIZE;
}

/*
 * A real connector (two sockets, hello held back) connects first, then 200
 * idle strays; the listener accepts them all. Then the hello goes out, 50 ms
 * and more after its connect: the connection must still complete.
 */
static void test_late_hello_survives_strays(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE], buf[TCP_HELLO_SIZE + TCP_RESCUE_SIZE];
	uint8_t reply[TCP_REPLY_SIZE];
	struct rail_handle h;
	void *ctx = NULL, *lc = NULL, *rc = NULL;
	int real[2], strays[NSTRAYS];
	uint64_t conn_id = rail_random64(), until;
	size_t got = 0;
	char why[128];

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unit_log_capture();
	assert_int_equal(rail_net_init(&ctx, 1, -1, unit_log_sink, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	for (int i = 0; i < 2; i++)
		real[i] = raw_connect(&h.addr);
	assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	for (int i = 0; i < NSTRAYS; i++) {
		strays[i] = raw_connect(&h.addr);
		if (i % 16 == 15)
			assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	}
	assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	assert_null(rc);
	usleep(50000);
	for (int i = 0; i < 2; i++)
		send_all(real[i], buf, real_hello(&h, conn_id, i, buf));
	until = rail_now_ns() + 5000000000ull;
	while (!rc && rail_now_ns() < until) {
		assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
		usleep(1000);
	}
	if (!rc)
		fail_msg("the connection with a late hello was not accepted in 5 s after %d idle "
			 "strays (dropped to make room?)", NSTRAYS);
	while (got < sizeof(reply)) {
		ssize_t n = recv(real[0], reply + got, sizeof(reply) - got, 0);

		assert_true(n > 0);
		got += (size_t)n;
	}
	assert_int_equal(tcp_reply_decode(reply), 0);
	/* The strays beyond the bound were closed, and it said so. */
	unit_assert_logged2(RAIL_LOG_WARN, "closing the new connection", "wait for their hello");
	assert_int_equal(rail_net_close_recv(rc), ncclSuccess);
	for (int i = 0; i < NSTRAYS; i++)
		close(strays[i]);
	for (int i = 0; i < 2; i++)
		close(real[i]);
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_late_hello_survives_strays),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
