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

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "rail.h"
#include "reqs.h"
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
	assert_int_equal(out.flags, 0);
	/* The lazy flag travels on socket 0 only; an unknown flag is refused. */
	in.index = 0;
	in.flags = TCP_HELLO_LAZY;
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), 0);
	assert_int_equal(out.flags, TCP_HELLO_LAZY);
	in.index = 1;
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), -EBADMSG);
	in.index = 0;
	in.flags = 0x80;
	tcp_hello_encode(&in, buf);
	assert_int_equal(tcp_hello_decode(buf, &out, why, sizeof(why)), -EBADMSG);
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
	assert_true(g.seq == f.seq && g.tag == f.tag && g.size == f.size && g.flags == 0);
	buf[0] ^= 1;
	assert_int_equal(tcp_frame_decode(buf, &g), -EPROTO);
	/* INLINE: up to NCCL_RAIL_TCP_DIRECT's maximum; no other flag */
	f.flags = TCP_FRAME_INLINE;
	f.size = TCP_DIRECT_MAX;
	tcp_frame_encode(&f, buf);
	assert_int_equal(tcp_frame_decode(buf, &g), 0);
	assert_true(g.flags == TCP_FRAME_INLINE && g.size == TCP_DIRECT_MAX);
	f.size = TCP_DIRECT_MAX + 1;
	tcp_frame_encode(&f, buf);
	assert_int_equal(tcp_frame_decode(buf, &g), -EPROTO);
	f.size = 8;
	f.flags = 0x02;
	tcp_frame_encode(&f, buf);
	assert_int_equal(tcp_frame_decode(buf, &g), -EPROTO);
	tcp_reply_encode(0, rep);
	assert_int_equal(tcp_reply_decode(rep), 0);
	tcp_reply_encode(EPERM, rep);
	assert_int_equal(tcp_reply_decode(rep), EPERM);
	rep[0] ^= 1;
	assert_int_equal(tcp_reply_decode(rep), -EPROTO);
}

/* Failover wire (version 3): rescue addresses and share, move hellos, the receiver's state. */
static void test_failover_wire(void **state)
{
	struct tcp_rescue r = { .count = 2 }, g;
	struct tcp_move_hello h = { .kind = TCP_MOVE_SOCKET, .index = 4, .nsocks = 4, .gen = 3,
				    .nonce = 77, .conn_id = 1ull << 50 }, hg;
	uint8_t buf[TCP_RESCUE_SIZE], mh[TCP_MOVE_HELLO_SIZE], st[TCP_STATE_SIZE(4)];
	uint64_t pos[5] = { 10, 1ull << 33, 0, 4096, 7 }, got[5];

	(void)state;
	assert_int_equal(rail_sockaddr_parse("10.1.2.3:4000", &r.addr[0]), 0);
	assert_int_equal(rail_sockaddr_parse("[fe80::1]:5000", &r.addr[1]), 0);
	for (int i = 0; i < TCP_SHARE_SIZE; i++)
		r.share[i] = (uint8_t)(i * 3 + 1);
	tcp_rescue_encode(&r, buf);
	assert_int_equal(tcp_rescue_decode(buf, &g), 0);
	assert_int_equal(g.count, 2);
	assert_memory_equal(g.share, r.share, TCP_SHARE_SIZE);
	assert_string_equal(RAIL_ADDRSTR(&g.addr[0]), "10.1.2.3:4000");
	assert_int_equal(rail_sockaddr_port(&g.addr[1]), 5000);
	for (size_t i = 0; i < sizeof(buf); i++) {
		buf[i] ^= 0x10;
		assert_int_equal(tcp_rescue_decode(buf, &g), -EPROTO);
		buf[i] ^= 0x10;
	}
	memset(h.rand, 0xa5, sizeof(h.rand));
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), 0);
	assert_true(hg.kind == h.kind && hg.index == 4 && hg.gen == 3 && hg.nonce == 77 &&
		    hg.conn_id == h.conn_id);
	assert_memory_equal(hg.rand, h.rand, sizeof(h.rand));
	/* A move hello of wire version 2 (40 bytes, no random) is refused. */
	rail_put_u16(mh + 4, 2);
	rail_put_u32(mh + 52, rail_fnv1a(mh, 52));
	assert_int_equal(tcp_move_hello_decode(mh, &hg), -EPROTO);
	tcp_move_hello_encode(&h, mh);
	mh[8] = 9; /* index beyond nsocks, checksum now wrong too */
	assert_int_equal(tcp_move_hello_decode(mh, &hg), -EPROTO);
	/* A version-1 hello on a rescue listener is not a move hello. */
	struct tcp_hello v1 = { .nonce = 1, .conn_id = 2, .nsocks = 1, .nthreads = 1,
				.min_chunk = 4096 };
	tcp_hello_encode(&v1, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), -EPROTO);
	/* A move back carries how long the sender's first interface has run; others carry 0. */
	h.kind = TCP_MOVE_BACK;
	h.up_s = 31;
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), 0);
	assert_true(hg.kind == TCP_MOVE_BACK && hg.up_s == 31 && hg.index == 4);
	h.kind = TCP_MOVE_SOCKET;
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), 0);
	assert_int_equal(hg.up_s, 0);
	/* Version 4: an OPEN names a data socket (1..nsocks); a move may carry no data socket. */
	h.kind = TCP_MOVE_OPEN;
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), 0);
	assert_true(hg.kind == TCP_MOVE_OPEN && hg.index == 4 && hg.nsocks == 4);
	h.index = 0;
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), -EPROTO);
	h.kind = TCP_MOVE_SOCKET;
	h.nsocks = 0;
	tcp_move_hello_encode(&h, mh);
	assert_int_equal(tcp_move_hello_decode(mh, &hg), 0);
	assert_int_equal(hg.nsocks, 0);
	h.index = 4;
	h.nsocks = 4;
	assert_int_equal(tcp_state_encode(3, 0, 4, pos, st), (int)TCP_STATE_SIZE(4));
	assert_int_equal(tcp_state_decode(st, 3, 4, got), 0);
	assert_memory_equal(got, pos, sizeof(pos));
	assert_int_equal(tcp_state_decode(st, 2, 4, got), -EPROTO);	/* another move */
	st[20] ^= 1;
	assert_int_equal(tcp_state_decode(st, 3, 4, got), -EPROTO);
	/* Declined: the sender stays where it runs; pos[0] says why. */
	pos[0] = TCP_BUSY_DOWN;
	tcp_state_encode(5, 1, 4, pos, st);
	assert_int_equal(tcp_state_decode(st, 5, 4, got), -EBUSY);
	assert_int_equal(got[0], TCP_BUSY_DOWN);
	assert_int_equal(tcp_state_decode(st, 4, 4, got), -EPROTO);
}

/*
 * The move handshake's cryptography (version 3): both ends derive the same
 * key from the two shares, which depends on every input; the listener's MAC
 * never passes for the mover's proof; a proof answers one challenge only
 * (a replay against a new challenge fails); any flipped bit fails.
 */
static void test_move_handshake(void **state)
{
	uint8_t sc[TCP_SHARE_SIZE], sl[TCP_SHARE_SIZE], k1[TCP_KEY_SIZE], k2[TCP_KEY_SIZE];
	uint8_t hello[TCP_MOVE_HELLO_SIZE], c1[TCP_MOVE_RAND_SIZE], c2[TCP_MOVE_RAND_SIZE];
	uint8_t lmac[TCP_MAC_SIZE], pm1[TCP_MAC_SIZE], pm2[TCP_MAC_SIZE], mac[TCP_MAC_SIZE];
	uint8_t rnd[TCP_MOVE_RAND_SIZE], buf[TCP_MOVE_CHALLENGE_SIZE];
	struct tcp_move_hello h = { .kind = TCP_MOVE_SOCKET, .index = 1, .nsocks = 4, .gen = 2,
				    .nonce = 5, .conn_id = 6 };

	(void)state;
	memset(sc, 1, sizeof(sc));
	memset(sl, 2, sizeof(sl));
	tcp_move_key(sc, sl, 6, 5, k1);
	tcp_move_key(sc, sl, 6, 5, k2);
	assert_memory_equal(k1, k2, sizeof(k1));
	tcp_move_key(sl, sc, 6, 5, k2);			/* the shares' order matters */
	assert_memory_not_equal(k1, k2, sizeof(k1));
	tcp_move_key(sc, sl, 7, 5, k2);			/* so does the conn_id */
	assert_memory_not_equal(k1, k2, sizeof(k1));
	sl[31] ^= 1;					/* and each bit of a share */
	tcp_move_key(sc, sl, 6, 5, k2);
	assert_memory_not_equal(k1, k2, sizeof(k1));
	tcp_move_hello_encode(&h, hello);
	memset(c1, 3, sizeof(c1));
	memset(c2, 4, sizeof(c2));
	tcp_move_mac(k1, TCP_ROLE_LISTENER, hello, c1, lmac);
	tcp_move_mac(k1, TCP_ROLE_MOVER, hello, c1, pm1);
	tcp_move_mac(k1, TCP_ROLE_MOVER, hello, c2, pm2);
	assert_memory_not_equal(lmac, pm1, sizeof(pm1));	/* no reflection */
	assert_memory_not_equal(pm1, pm2, sizeof(pm1));		/* no replay */
	tcp_move_mac(k2, TCP_ROLE_MOVER, hello, c1, mac);	/* another key */
	assert_memory_not_equal(mac, pm1, sizeof(pm1));
	for (size_t i = 0; i < sizeof(hello); i++) {		/* every byte of the hello counts */
		hello[i] ^= 0x01;
		tcp_move_mac(k1, TCP_ROLE_MOVER, hello, c1, mac);
		assert_memory_not_equal(mac, pm1, sizeof(pm1));
		hello[i] ^= 0x01;
	}
	tcp_move_challenge_encode(c1, lmac, buf);
	assert_int_equal(tcp_move_challenge_decode(buf, rnd, mac), 0);
	assert_memory_equal(rnd, c1, sizeof(c1));
	assert_memory_equal(mac, lmac, sizeof(lmac));
	buf[0] ^= 1;
	assert_int_equal(tcp_move_challenge_decode(buf, rnd, mac), -EPROTO);
	tcp_move_proof_encode(pm1, buf);
	assert_int_equal(tcp_move_proof_decode(buf, mac), 0);
	assert_memory_equal(mac, pm1, sizeof(pm1));
	assert_int_equal(tcp_move_challenge_decode(buf, rnd, mac), -EPROTO); /* not a challenge */
	buf[5] = 1;
	assert_int_equal(tcp_move_proof_decode(buf, mac), -EPROTO);
}

/* The receiver's refusal: round trip, and every malformed variant refused. */
static void test_refusal(void **state)
{
	struct tcp_refusal r = { .reason = TCP_REFUSE_SIZE, .tag = 3, .seq = 9, .size = 1000,
				 .posted = 500 }, g;
	uint8_t buf[TCP_REFUSAL_SIZE], bad[TCP_REFUSAL_SIZE];

	(void)state;
	tcp_refusal_encode(&r, buf);
	assert_int_equal(tcp_refusal_decode(buf, &g), 0);
	assert_int_equal(g.reason, TCP_REFUSE_SIZE);
	assert_int_equal(g.tag, 3);
	assert_int_equal(g.seq, 9);
	assert_int_equal(g.size, 1000);
	assert_int_equal(g.posted, 500);
	r = (struct tcp_refusal){ .reason = TCP_REFUSE_TAG, .tag = 5, .want_tag = 7, .size = 8 };
	tcp_refusal_encode(&r, buf);
	assert_int_equal(tcp_refusal_decode(buf, &g), 0);
	assert_int_equal(g.want_tag, 7);
	/* A magic, a pad byte, an unknown reason, a size that fits, a huge size. */
	static const struct {
		int off;
		uint8_t val;
	} flips[] = { { 0, 0x46 }, { 2, 1 }, { 13, 1 }, { 1, 3 }, { 1, 0 } };
	for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
		memcpy(bad, buf, sizeof(bad));
		bad[flips[i].off] = flips[i].val;
		assert_int_equal(tcp_refusal_decode(bad, &g), -EPROTO);
	}
	r = (struct tcp_refusal){ .reason = TCP_REFUSE_SIZE, .size = 500, .posted = 500 };
	tcp_refusal_encode(&r, bad);
	assert_int_equal(tcp_refusal_decode(bad, &g), -EPROTO);
	r = (struct tcp_refusal){ .reason = TCP_REFUSE_SIZE, .size = UINT64_MAX, .posted = 1 };
	tcp_refusal_encode(&r, bad);
	assert_int_equal(tcp_refusal_decode(bad, &g), -EPROTO);
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

/* Connect and accept on device 0 until both comms exist, each call succeeding, by until. */
static void pair_up(void *ctx, void *lc, void *handle, uint64_t until, void **sc, void **rc)
{
	while ((!*sc || !*rc) && rail_now_ns() < until) {
		if (!*sc)
			assert_int_equal(rail_net_connect(ctx, 0, -1, handle, sc), ncclSuccess);
		if (!*rc)
			assert_int_equal(rail_net_accept(lc, rc), ncclSuccess);
	}
	assert_non_null(*sc);
	assert_non_null(*rc);
}

/*
 * A 1000-byte send into a 500-byte receive: the receive fails, and the
 * sender is told (its send, or one of the small sends after it, fails with
 * a WARN naming the receiver's refusal and both sizes).
 */
static void test_sender_told_of_refusal(void **state)
{
	static char sbuf[1000], rbuf[1000];
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL, *sreq = NULL, *rreq = NULL;
	void *data[1] = { rbuf };
	size_t room[1] = { 500 };
	int tag[1] = { 1 }, done = 0, size = 0, later = 0;
	ncclResult_t rres = ncclSuccess, sres = ncclSuccess;
	uint64_t deadline = rail_now_ns() + 10ull * 1000000000ull;

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unit_log_capture();
	assert_int_equal(rail_net_init(&ctx, 1, -1, unit_log_sink, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	pair_up(ctx, lc, handle, deadline, &sc, &rc);
	while (!rreq)
		assert_int_equal(rail_net_irecv(rc, 1, data, room, tag, NULL, &rreq), ncclSuccess);
	while (!sreq)
		assert_int_equal(rail_net_isend(sc, sbuf, sizeof(sbuf), 1, NULL, &sreq), ncclSuccess);
	while (rres == ncclSuccess && !done && rail_now_ns() < deadline)
		rres = rail_net_test(rreq, &done, &size);
	assert_int_equal(rres, ncclInvalidUsage);
	/* The sender: its send completes or fails; later sends fail once it is told. */
	while (sres == ncclSuccess && rail_now_ns() < deadline) {
		done = 0;
		if (sreq)
			sres = rail_net_test(sreq, &done, &size);
		else
			sres = rail_net_isend(sc, sbuf, 8, 2, NULL, &sreq), later++;
		if (done)
			sreq = NULL;
	}
	if (sres != ncclInvalidUsage)
		fail_msg("the sender was not told of the refusal: %d after %d later sends", sres,
			 later);
	unit_assert_logged2(RAIL_LOG_WARN, "refused message 0 of 1000 bytes", "only 500 bytes");
	if (sreq)
		rail_net_test(sreq, &done, &size);
	assert_int_equal(rail_net_close_send(sc), ncclSuccess);
	assert_int_equal(rail_net_close_recv(rc), ncclSuccess);
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
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
	assert_false(unit_log_has(RAIL_LOG_WARN, "the listener runs"));	/* same release */
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
}

/*
 * The same refusal from a listener whose handle says it runs another
 * release: the connector's warning names both releases (the likely cause).
 */
static void test_refusal_names_release(void **state)
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
	assert_string_equal(h.release, RAIL_VERSION_STRING);
	h.nonce ^= 0x5a5aull;
	assert_int_equal(rail_handle_encode(&h, handle, sizeof(handle)), 0);
	memcpy(handle + RAIL_HANDLE_RELEASE_OFFSET, "9.8.7", 6);
	for (int i = 0; i < 100000 && res == ncclSuccess && !sc; i++) {
		res = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (!rc)
			assert_int_equal(rail_net_accept(lc, &rc), ncclSuccess);
	}
	assert_int_equal(res, ncclRemoteError);
	unit_assert_logged2(RAIL_LOG_WARN, "the listener refused the connection",
			    "(the listener runs nccl-net-rail 9.8.7, this node " RAIL_VERSION_STRING
			    ": use one release on every node)");
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
}

/*
 * Every close() of this binary (the core library is linked in statically)
 * goes through here: a close of a number that is not open is a double close
 * the process survived only by luck (in NCCL's process the number may belong
 * to someone else by then).
 */
static int close_ebadf;

int close(int fd)
{
	if (syscall(SYS_close, fd) == 0)
		return 0;
	if (errno == EBADF)
		close_ebadf++;
	return -1;
}

#define SENTINELS 256

/* Take the lowest free fd numbers: those the plugin just closed. */
static void sentinels_fill(int *fds, int *n, int more)
{
	while (more-- > 0 && *n < SENTINELS) {
		fds[*n] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		assert_true(fds[*n] >= 0);
		(*n)++;
	}
}

/*
 * A TCP net context and listen comm with NCCL_RAIL_TCP_FAULT=fault armed
 * (connect given 3 s; lazy0: NCCL_RAIL_TCP_LAZY=0), the log captured.
 */
static void fault_net_up(const char *fault, int lazy0, void **ctx, void **lc, uint8_t *handle)
{
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_TCP_FAULT", fault, 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "3", 1);
	if (lazy0)
		setenv("NCCL_RAIL_TCP_LAZY", "0", 1);	/* the data sockets at connect */
	unit_log_capture();
	assert_int_equal(rail_net_init(ctx, 1, -1, unit_log_sink, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(*ctx, 0, handle, lc), ncclSuccess);
}

static void fault_net_down(void *ctx, void *lc)
{
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
	unsetenv("NCCL_RAIL_TCP_FAULT");
	unsetenv("NCCL_RAIL_CONNECT_TIMEOUT");
	unsetenv("NCCL_RAIL_TCP_LAZY");
}

/*
 * Helper threads cannot start (pthread_create EAGAIN, as under RLIMIT_NPROC
 * or a pids cgroup): connect and accept fail with a named error, and every
 * socket is closed exactly once; no fd opened afterwards (the sentinels,
 * which take the numbers the plugin freed) is closed by the plugin.
 */
static void test_thread_failure_closes_once(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
	ncclResult_t cres = ncclSuccess, ares = ncclSuccess;
	int sent[SENTINELS], nsent = 0, calls = 0;
	uint64_t until;

	(void)state;
	fault_net_up("pthread_create:EAGAIN:1+", 1, &ctx, &lc, handle);
	close_ebadf = 0;
	until = rail_now_ns() + 6000000000ull;
	while (cres == ncclSuccess && !sc && rail_now_ns() < until) {
		cres = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (ares == ncclSuccess && !rc)
			ares = rail_net_accept(lc, &rc);
		sentinels_fill(sent, &nsent, 4);
		calls++;
	}
	/* A few more calls with the same handle buffer: nothing stale is closed. */
	for (int i = 0; i < 3 && cres != ncclSuccess; i++) {
		sentinels_fill(sent, &nsent, 8);
		rail_net_connect(ctx, 0, -1, handle, &sc);
	}
	/* A sentinel closed by the plugin is open no more, or its number was reused by a later one. */
	for (int i = 0; i < nsent; i++) {
		if (fcntl(sent[i], F_GETFD) < 0)
			fail_msg("sentinel fd %d (opened after the plugin freed its number) was closed "
				 "by the plugin", sent[i]);
		for (int j = 0; j < i; j++)
			if (sent[j] == sent[i])
				fail_msg("sentinel fd %d was closed by the plugin (its number was given "
					 "to a later sentinel)", sent[i]);
	}
	if (close_ebadf)
		fail_msg("%d close() calls on fds that were not open (double closes)", close_ebadf);
	if (cres == ncclSuccess)
		fail_msg("connect neither failed nor completed in %d calls", calls);
	/* The accepting side fails first (its comm is made before its reply), so the
	 * connector sees the listener close the connection. */
	assert_int_equal(cres, ncclRemoteError);
	assert_null(sc);
	assert_int_equal(ares, ncclSystemError);
	assert_null(rc);
	unit_assert_logged2(RAIL_LOG_WARN, "helper thread", "RLIMIT_NPROC");
	unit_assert_logged2(RAIL_LOG_WARN, "closed the connection before accepting", "own log");
	fault_net_down(ctx, lc);
	for (int i = 0; i < nsent; i++)
		close(sent[i]);
}

/*
 * The accepting side's reply to a connector fails (NCCL_RAIL_TCP_FAULT
 * accept_reply, as a send on a socket the peer reset): its receive comm,
 * made and registered for its lazy data sockets before the reply (so that
 * a sender that has the reply can open them at once), is closed again;
 * accept fails with the error named, the connector's connect fails (its
 * socket closed without a reply), and a second pair then connects and
 * moves a message above NCCL_RAIL_TCP_DIRECT (through the lazy data
 * sockets) right after connect.
 */
static void test_accept_reply_failure(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE], h2[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL, *sr = NULL, *rr = NULL;
	ncclResult_t cres = ncclSuccess, ares = ncclSuccess;
	size_t n = 300000;
	char *sb = malloc(n), *rb = calloc(1, n);
	void *sreq = NULL, *rreq = NULL, *rbuf = rb, *mh = NULL;
	int tag = 1;
	uint64_t until;

	(void)state;
	fault_net_up("accept_reply:ECONNRESET:1", 0, &ctx, &lc, handle);
	memcpy(h2, handle, sizeof(h2));
	until = rail_now_ns() + 6000000000ull;
	while ((cres == ncclSuccess && !sc) && rail_now_ns() < until) {
		cres = rail_net_connect(ctx, 0, -1, handle, &sc);
		if (ares == ncclSuccess && !rc)
			ares = rail_net_accept(lc, &rc);
	}
	assert_int_equal(ares, ncclRemoteError);	/* ECONNRESET: the peer's doing */
	assert_null(rc);
	assert_int_equal(cres, ncclRemoteError);
	assert_null(sc);
	unit_assert_logged2(RAIL_LOG_WARN, "sending the reply", "Connection reset by peer");
	unit_assert_logged2(RAIL_LOG_WARN, "closed the connection before accepting", "own log");
	/* The listen comm still serves the next connector. */
	pair_up(ctx, lc, h2, rail_now_ns() + 6000000000ull, &sr, &rr);
	for (size_t i = 0; i < n; i++)
		sb[i] = (char)(i * 7 + 3);
	while (!sreq)
		assert_int_equal(rail_net_isend(sr, sb, n, 1, NULL, &sreq), ncclSuccess);
	while (!rreq)
		assert_int_equal(rail_net_irecv(rr, 1, &rbuf, &n, &tag, &mh, &rreq), ncclSuccess);
	reqs_wait(&sreq, &rreq, &n, 1, 10, "300 kB right after connect");
	assert_memory_equal(sb, rb, n);
	assert_int_equal(rail_net_close_send(sr), ncclSuccess);
	assert_int_equal(rail_net_close_recv(rr), ncclSuccess);
	fault_net_down(ctx, lc);
	free(sb);
	free(rb);
}

/*
 * Only the accepting side's receive comm fails to come up (the first
 * helper thread creation fails, and with NCCL_RAIL_TCP_LAZY=0 the
 * acceptor makes its comm, and its data sockets' thread, first): the
 * connector must fail, told that the listener closed the connection. The
 * acceptor makes its comm before it replies; when it replied first, the
 * connector went on as if accepted (here it then failed on its own, with
 * a system error that blamed itself), and a sender could open its lazy
 * data sockets before the acceptor's comm was there to take them (the
 * listener refused them: a conformance failure under TSan).
 */
static void test_accept_fails_before_reply(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
	ncclResult_t cres = ncclSuccess, ares = ncclSuccess;
	uint64_t until;

	(void)state;
	fault_net_up("pthread_create:EAGAIN:1", 1, &ctx, &lc, handle);
	until = rail_now_ns() + 6000000000ull;
	/* Accept first in each round, as the acceptor's comm is what fails. */
	while (cres == ncclSuccess && !sc && rail_now_ns() < until) {
		if (ares == ncclSuccess && !rc)
			ares = rail_net_accept(lc, &rc);
		cres = rail_net_connect(ctx, 0, -1, handle, &sc);
	}
	assert_int_equal(ares, ncclSystemError);
	assert_null(rc);
	if (sc)
		fail_msg("the connector got a comm although the acceptor's failed");
	assert_int_equal(cres, ncclRemoteError);
	unit_assert_logged2(RAIL_LOG_WARN, "closed the connection before accepting", "own log");
	fault_net_down(ctx, lc);
}

#define STRAYS 100
#define STRAY_FD_LIMIT 64

/* Connect and wait for the comm, within 20 s; 0 or a message on stderr and 1. */
static int real_connect(uint8_t *handle, void **sc)
{
	uint64_t until = rail_now_ns() + 20000000000ull;
	ncclResult_t res = ncclSuccess;

	*sc = NULL;
	while (res == ncclSuccess && !*sc && rail_now_ns() < until) {
		res = rail_net_connect(NULL, 0, -1, handle, sc);
		usleep(200);
	}
	if (!*sc)
		fprintf(stderr, "strays: the real connect %s\n", res == ncclSuccess ?
			"did not complete in 20 s" : "failed");
	return !*sc;
}

/* The stray maker (normal fd limit): idle strays, a real connect, strays gone, another. */
static int strays_main(const uint8_t *handle, int ready_fd)
{
	const union rail_sockaddr *addr;
	struct rail_handle h;
	uint8_t hb[2][RAIL_HANDLE_SIZE];
	int strays[STRAYS], rc = 0;
	void *sc[2] = { NULL, NULL };
	char why[128];

	if (rail_handle_decode(handle, RAIL_HANDLE_SIZE, &h, why, sizeof(why)))
		return 2;
	addr = &h.addr;
	for (int i = 0; i < STRAYS; i++) {
		strays[i] = socket(addr->sa.sa_family, SOCK_STREAM, 0);
		if (strays[i] < 0 || connect(strays[i], &addr->sa, sizeof(*addr)) < 0) {
			perror("strays: connect");
			return 2;
		}
	}
	if (write(ready_fd, "s", 1) != 1)
		return 2;
	memcpy(hb[0], handle, RAIL_HANDLE_SIZE);
	memcpy(hb[1], handle, RAIL_HANDLE_SIZE);
	rc |= real_connect(hb[0], &sc[0]);
	for (int i = 0; i < STRAYS; i++)
		close(strays[i]);
	rc |= real_connect(hb[1], &sc[1]);
	if (write(ready_fd, "d", 1) != 1)
		return 2;
	for (int i = 0; i < 2; i++)
		if (sc[i])
			rail_net_close_send(sc[i]);
	return rc;
}

/* The listener, under a low fd limit: accept must never fail, and get both real comms. */
static int listener_main(void *lc, pid_t stray_pid, int ready_fd)
{
	uint64_t until = rail_now_ns() + 30000000000ull;
	void *rc[2] = { NULL, NULL };
	int got = 0;
	char c;

	if (read(ready_fd, &c, 1) != 1)
		return 2;
	while (got < 2 && rail_now_ns() < until) {
		ncclResult_t res = rail_net_accept(lc, &rc[got]);

		if (res != ncclSuccess) {
			fprintf(stderr, "strays: accept returned %d with %d idle strays and a %d-fd "
				"limit\n", (int)res, STRAYS, STRAY_FD_LIMIT);
			kill(stray_pid, SIGKILL);
			return 1;
		}
		if (rc[got])
			got++;
		usleep(200);
	}
	if (got < 2)
		fprintf(stderr, "strays: %d of 2 real connections accepted in 30 s\n", got);
	for (int i = 0; i < got; i++)
		rail_net_close_recv(rc[i]);
	return got < 2;
}

static int strays_process(void)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	struct rlimit rl;
	void *ctx = NULL, *lc = NULL;
	int p[2], status = 0, rc;
	pid_t pid;

	alarm(60);
	if (rail_net_init(&ctx, 1, -1, NULL, 12) != ncclSuccess ||
	    rail_net_listen(ctx, 0, handle, &lc) != ncclSuccess || pipe(p))
		return 2;
	pid = fork();
	if (pid == 0)
		_exit(strays_main(handle, p[1]));
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = STRAY_FD_LIMIT;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		return 2;
	rc = listener_main(lc, pid, p[0]);
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		rc |= 4;
	rail_net_close_listen(lc);
	rail_net_finalize(ctx);
	return rc;
}

/*
 * 100 idle stray connections (a port scanner, a health check) to a listener
 * whose process may hold 64 fds: accept never fails, and real connections
 * are accepted while the strays are there and after they are gone.
 */
static void test_strays_do_not_disable_listener(void **state)
{
	int status = 0;
	pid_t pid;

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(strays_process());
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status))
		fail_msg("the listener process died of signal %d (60 s alarm: a hang)",
			 WTERMSIG(status));
	if (WEXITSTATUS(status))
		fail_msg("the listener process exited with %d (1: accept failed or missed a real "
			 "connection, 4: the real connects failed, 2: setup)", WEXITSTATUS(status));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_round_trip),
		cmocka_unit_test(test_hello_rejects),
		cmocka_unit_test(test_frame_and_reply),
		cmocka_unit_test(test_refusal),
		cmocka_unit_test(test_failover_wire),
		cmocka_unit_test(test_move_handshake),
		cmocka_unit_test(test_plan),
		cmocka_unit_test(test_wrong_nonce_refused),
		cmocka_unit_test(test_refusal_names_release),
		cmocka_unit_test(test_sender_told_of_refusal),
		cmocka_unit_test(test_thread_failure_closes_once),
		cmocka_unit_test(test_accept_reply_failure),
		cmocka_unit_test(test_accept_fails_before_reply),
		cmocka_unit_test(test_strays_do_not_disable_listener),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
