/*
 * Unit tests of the TCP transport's wire decoding (tcp_wire.c) and of its
 * handshake's refusals: a connector presenting a handle whose nonce does
 * not match the listen comm is refused with an error naming the nonce.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api.h"
#include "handle.h"
#include "tcp/tcp.h"
#include "unit.h"
#include "wire.h"

static void test_hello_round_trip(void **state)
{
	struct tcp_hello in = { .index = 3, .nonce = 0x1122334455667788ull, .conn_id = 42,
				.nsocks = 4, .nthreads = 2, .inline_max = 65536,
				.min_chunk = 524288 };
	struct tcp_hello out;
	uint8_t buf[TCP_HELLO_SIZE];
	char why[128];

	(void)state;
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), 0);
	assert_int_equal(out.index, 3);
	assert_true(out.nonce == in.nonce);
	assert_true(out.conn_id == 42);
	assert_int_equal(out.nsocks, 4);
	assert_int_equal(out.nthreads, 2);
	assert_int_equal(out.inline_max, 65536);
	assert_int_equal(out.min_chunk, 524288);
}

static void test_hello_rejects(void **state)
{
	struct tcp_hello in = { .index = 0, .nonce = 7, .conn_id = 9, .nsocks = 4,
				.nthreads = 4, .inline_max = 0, .min_chunk = 4096 };
	struct tcp_hello out;
	uint8_t buf[TCP_HELLO_SIZE], bad[TCP_HELLO_SIZE];
	char why[128];

	(void)state;
	tcp_hello_encode(&in, buf);
	/* Every single flipped byte is caught (magic, version or checksum). */
	for (size_t i = 0; i < TCP_HELLO_SIZE; i++) {
		memcpy(bad, buf, sizeof(bad));
		bad[i] ^= 0x40;
		why[0] = '\0';
		assert_true(tcp_hello_decode(bad, &out, why, sizeof(why)) < 0);
		assert_true(why[0] != '\0');
	}
	/* A consistent checksum over impossible values is still refused. */
	in.nthreads = 5; /* more threads than sockets */
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), -EBADMSG);
	in.nthreads = 4;
	in.index = 5; /* beyond nsocks */
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), -EBADMSG);
	/* Another wire version names the mismatch. */
	in.index = 0;
	tcp_hello_encode(&in, buf);
	rail_put_u16(buf + 4, TCP_WIRE_VERSION + 1);
	rail_put_u32(buf + 36, rail_fnv1a(buf, 36));
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), -EPROTONOSUPPORT);
	assert_non_null(strstr(why, "version"));
}

static void test_frame_and_reply(void **state)
{
	struct tcp_frame f = { .seq = 1ull << 40, .tag = -3, .size = 123456789 }, g;
	uint8_t buf[TCP_FRAME_SIZE], rep[TCP_REPLY_SIZE];

	(void)state;
	tcp_frame_encode(&f, buf);
	assert_int_equal(tcp_frame_decode(buf, &g), 0);
	assert_true(g.seq == f.seq && g.tag == f.tag && g.size == f.size);
	buf[0] ^= 1;
	assert_int_equal(tcp_frame_decode(buf, &g), -EPROTO);
	tcp_reply_encode(0, rep);
	assert_int_equal(tcp_reply_decode(rep), 0);
	tcp_reply_encode(EPERM, rep);
	assert_int_equal(tcp_reply_decode(rep), EPERM);
	rep[0] ^= 1;
	assert_int_equal(tcp_reply_decode(rep), -EPROTO);
}

static void test_plan(void **state)
{
	struct tcp_plan p;

	(void)state;
	/* Up to min_chunk: one piece, on a socket that rotates with seq. */
	tcp_plan_message(100, 5, 4, 65536, &p);
	assert_int_equal(p.nchunks, 1);
	assert_int_equal(p.first, 1);
	/* Large: at most one piece per socket, 4 KiB aligned, covering it all. */
	tcp_plan_message((64u << 20) + 1, 0, 4, 65536, &p);
	assert_int_equal(p.nchunks, 4);
	assert_int_equal(p.chunk % 4096, 0);
	assert_true(p.chunk * 4 >= (64u << 20) + 1);
	assert_true(p.chunk * 3 < (64u << 20) + 1);
	tcp_plan_message(0, 0, 4, 65536, &p);
	assert_int_equal(p.nchunks, 0);
}

/* Connect with a handle whose nonce was changed (checksum fixed up). */
static void test_wrong_nonce_refused(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	struct rail_handle h;
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
	ncclResult_t res = ncclSuccess;
	char why[128];

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unit_log_capture();
	assert_int_equal(rail_net_init(&ctx, 1, -1, unit_log_sink, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	h.nonce ^= 0xdeadbeefull;
	assert_int_equal(rail_handle_encode(&h, handle, sizeof(handle)), 0);
	for (int i = 0; i < 100000 && res == ncclSuccess && !sc; i++) {
		res = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (!rc)
			assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	}
	assert_int_equal(res, ncclRemoteError);
	assert_null(sc);
	assert_null(rc);
	unit_assert_logged2(RAIL_LOG_WARN, "refus", "nonce");
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_round_trip),
		cmocka_unit_test(test_hello_rejects),
		cmocka_unit_test(test_frame_and_reply),
		cmocka_unit_test(test_plan),
		cmocka_unit_test(test_wrong_nonce_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
