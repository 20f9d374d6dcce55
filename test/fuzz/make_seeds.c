/*
 * Writes the seed corpus of the fuzz targets (test/fuzz/corpus/<target>/)
 * with the real encoders, so the seeds follow the wire formats:
 *   make-seeds DIR      (make fuzz-seeds runs it into test/fuzz/corpus)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check/check.h"
#include "handle.h"
#include "ib/ib_wire.h"
#include "rma/rma_tcp.h"
#include "tcp/tcp.h"
#include "wire.h"

static int put(const char *dir, const char *target, const char *name, const void *buf,
	       size_t len)
{
	char p[4096];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, target);
	if (mkdir(p, 0755) && errno != EEXIST)
		return -1;
	snprintf(p, sizeof(p), "%s/%s/%s", dir, target, name);
	f = fopen(p, "wb");
	if (!f || fwrite(buf, 1, len, f) != len) {
		perror(p);
		return -1;
	}
	return fclose(f);
}

/* The failover messages after the others (fuzz_tcp_wire.c's order): a move of 4 sockets. */
static size_t tcp_failover_seed(uint8_t *b, int kind)
{
	struct tcp_rescue r = { .count = 2 };
	struct tcp_move_hello mh = { .kind = kind, .index = 0, .nsocks = 4, .gen = 1,
				     .nonce = 0x1122334455667788ull, .conn_id = 42 };
	uint8_t key[TCP_KEY_SIZE], mac[TCP_MAC_SIZE], rnd[TCP_MOVE_RAND_SIZE];
	uint64_t pos[5] = { 4096, 0, 65536, 1 << 20, 7 };
	size_t off = 0;

	inet_pton(AF_INET, "10.0.0.1", &r.addr[0].sin.sin_addr);
	r.addr[0].sin.sin_family = AF_INET;
	r.addr[0].sin.sin_port = htons(4000);
	inet_pton(AF_INET6, "fe80::1", &r.addr[1].sin6.sin6_addr);
	r.addr[1].sin6.sin6_family = AF_INET6;
	r.addr[1].sin6.sin6_port = htons(4001);
	memset(r.share, 0x42, sizeof(r.share));
	tcp_rescue_encode(&r, b + off);
	off += TCP_RESCUE_SIZE;
	memset(mh.rand, 0x5a, sizeof(mh.rand));
	tcp_move_hello_encode(&mh, b + off);
	memset(key, 7, sizeof(key));
	memset(rnd, 9, sizeof(rnd));
	tcp_move_mac(key, TCP_ROLE_LISTENER, b + off, rnd, mac);
	off += TCP_MOVE_HELLO_SIZE;
	tcp_move_challenge_encode(rnd, mac, b + off);
	off += TCP_MOVE_CHALLENGE_SIZE;
	tcp_move_proof_encode(mac, b + off);
	off += TCP_MOVE_PROOF_SIZE;
	b[off++] = 3; /* 4 sockets */
	off += (size_t)tcp_state_encode(1, 0, 4, pos, b + off);
	return off;
}

static int tcp_seeds(const char *dir)
{
	enum { BASE = TCP_HELLO_SIZE + TCP_REPLY_SIZE + TCP_FRAME_SIZE + TCP_REFUSAL_SIZE };
	uint8_t b[BASE + TCP_RESCUE_SIZE + TCP_MOVE_HELLO_SIZE + TCP_MOVE_CHALLENGE_SIZE +
		  TCP_MOVE_PROOF_SIZE + 1 + TCP_STATE_SIZE(4)];
	struct tcp_hello h = { .index = 1, .nonce = 0x1122334455667788ull, .conn_id = 42,
			       .nsocks = 4, .nthreads = 4, .inline_max = 16384,
			       .min_chunk = 65536 };
	struct tcp_frame f = { .seq = 7, .tag = 3, .size = 1000 };
	struct tcp_refusal r = { .reason = TCP_REFUSE_SIZE, .tag = 3, .seq = 7, .size = 1000,
				 .posted = 500 };
	size_t n;

	tcp_hello_encode(&h, b);
	tcp_reply_encode(0, b + TCP_HELLO_SIZE);
	tcp_frame_encode(&f, b + TCP_HELLO_SIZE + TCP_REPLY_SIZE);
	tcp_refusal_encode(&r, b + TCP_HELLO_SIZE + TCP_REPLY_SIZE + TCP_FRAME_SIZE);
	n = BASE + tcp_failover_seed(b + BASE, TCP_MOVE_SOCKET);
	if (put(dir, "fuzz_tcp_wire", "all-valid", b, n))
		return -1;
	h.index = 0;
	tcp_hello_encode(&h, b);
	tcp_reply_encode(EPERM, b + TCP_HELLO_SIZE);
	r = (struct tcp_refusal){ .reason = TCP_REFUSE_TAG, .tag = 5, .want_tag = 7, .seq = 1,
				  .size = 8 };
	tcp_refusal_encode(&r, b + TCP_HELLO_SIZE + TCP_REPLY_SIZE + TCP_FRAME_SIZE);
	n = BASE + tcp_failover_seed(b + BASE, TCP_MOVE_KICK);
	return put(dir, "fuzz_tcp_wire", "control-refused", b, n);
}

static int handle_seeds(const char *dir)
{
	uint8_t b[RAIL_HANDLE_SIZE];
	struct rail_handle h = { .transport = RAIL_TRANSPORT_TCP, .nonce = 0xabcdefull };

	h.addr.sin.sin_family = AF_INET;
	h.addr.sin.sin_port = htons(43210);
	h.addr.sin.sin_addr.s_addr = htonl(0x0a000001);
	if (rail_handle_encode(&h, b, sizeof(b)) || put(dir, "fuzz_handle", "tcp-v4", b, sizeof(b)))
		return -1;
	h.transport = RAIL_TRANSPORT_IB;
	memset(&h.addr, 0, sizeof(h.addr));
	h.addr.sin6.sin6_family = AF_INET6;
	h.addr.sin6.sin6_port = htons(5000);
	h.addr.sin6.sin6_addr.s6_addr[15] = 1;
	h.payload_len = 4;
	memcpy(h.payload, "rail", 4);
	if (rail_handle_encode(&h, b, sizeof(b)))
		return -1;
	return put(dir, "fuzz_handle", "ib-v6-payload", b, sizeof(b));
}

/* After the handshake: a MOVE with its state and flags, MOVE_READY, the probe's three. */
static int ib_move_seeds(const char *dir)
{
	static uint8_t b[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	static const char *const names[] = { "msg-move", "msg-move-ready", "msg-probe",
					     "msg-probe-ack", "msg-probe-ack-refused",
					     "msg-probe-done" };
	static const int types[] = { RAIL_IB_MSG_MOVE, RAIL_IB_MSG_MOVE_READY, RAIL_IB_MSG_PROBE,
				     RAIL_IB_MSG_PROBE_ACK, RAIL_IB_MSG_PROBE_ACK,
				     RAIL_IB_MSG_PROBE_DONE };
	struct rail_ib_msg m;
	int n;

	for (int i = 0; i < (int)(sizeof(types) / sizeof(types[0])); i++) {
		int one = types[i] == RAIL_IB_MSG_PROBE || (types[i] == RAIL_IB_MSG_PROBE_ACK && i == 3);

		memset(&m, 0, sizeof(m));
		m.type = types[i];
		m.nonce = 7;
		m.ndevs = m.nqps = types[i] == RAIL_IB_MSG_MOVE ? 2 : one;
		m.qpn[0] = 0x11;
		m.qpn[1] = 0x12;
		m.devs[0].port = m.devs[1].port = 1;
		m.devs[0].link_layer = m.devs[1].link_layer = 2;
		m.devs[0].mtu = m.devs[1].mtu = 5;
		m.devs[0].gid[15] = 1;
		m.ctrl_addr = 0x7f0000003000ull;
		m.aux_addr = 0x1122334455667788ull;
		m.refuse_code = i == 4 ? RAIL_IB_PROBE_REFUSED : 0;
		if (types[i] == RAIL_IB_MSG_MOVE) {
			m.move = (struct rail_ib_move_state){ .epoch = 1, .role = 1, .reason = 7,
							      .flags = RAIL_IB_MOVE_F_AVOID,
							      .seq = 9, .nans = 2 };
			snprintf(m.text, sizeof(m.text), "stall");
		}
		n = rail_ib_msg_encode(&m, b, sizeof(b));
		if (n < 0 || put(dir, "fuzz_ib_wire", names[i], b, (size_t)n))
			return -1;
	}
	return 0;
}

static int ib_seeds(const char *dir)
{
	static uint8_t b[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg m;
	struct rail_ib_cts c = { .addr = 0x7f0000001000ull, .size = 4096, .tag = 1, .nreqs = 2,
				 .idx = 1, .seq = 9 };
	char name[32];
	int n;

	for (int type = RAIL_IB_MSG_HELLO; type <= RAIL_IB_MSG_REFUSE; type++) {
		memset(&m, 0, sizeof(m));
		m.type = type;
		m.nonce = 0x55aa;
		m.ndevs = 2;
		m.qps_per_dev = 1;
		m.nqps = type == RAIL_IB_MSG_HELLO ? 0 : 2;
		m.qpn[0] = 0x11;
		m.qpn[1] = 0x12;
		m.devs[0].port = m.devs[1].port = 1;
		m.devs[0].link_layer = m.devs[1].link_layer = 2;
		m.devs[0].mtu = m.devs[1].mtu = 5;
		m.devs[0].gid[15] = 1;
		m.ctrl_addr = 0x7f0000002000ull;
		m.refuse_code = type == RAIL_IB_MSG_REFUSE ? RAIL_IB_REFUSE_NONCE : 0;
		if (type == RAIL_IB_MSG_REFUSE)
			snprintf(m.text, sizeof(m.text), "nonce does not match");
		n = rail_ib_msg_encode(&m, b, sizeof(b));
		snprintf(name, sizeof(name), "msg-type%d", type);
		if (n < 0 || put(dir, "fuzz_ib_wire", name, b, (size_t)n))
			return -1;
	}
	if (ib_move_seeds(dir))
		return -1;
	memset(b, 0, RAIL_IB_CTS_SIZE);
	rail_ib_cts_encode(&c, b);
	return put(dir, "fuzz_ib_wire", "cts", b, RAIL_IB_CTS_SIZE);
}

static int text_seeds(const char *dir)
{
	static const char *const s[] = {
		"/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0/net/eth0",
		"0000:1b:00.0", "10.0.0.0/8", "^mlx5_0:1,=mlx5_1:2:0:1", "fe80::/64",
	};
	char name[16];

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		snprintf(name, sizeof(name), "s%zu", i);
		if (put(dir, "fuzz_text", name, s[i], strlen(s[i])))
			return -1;
	}
	return 0;
}

/* sysfs records: [file index u16][length u8][content]. */
static int sysfs_seeds(const char *dir)
{
	static const uint8_t a[] = { 3, 0, 4, '1', '0', '0', '\n', 9, 0, 3, '0', '-', '3' };
	static const uint8_t b[] = { 17, 0, 5, 'f', 'e', '8', '0', ':', 40, 0, 2, '-', '1' };

	if (put(dir, "fuzz_sysfs", "two-files", a, sizeof(a)))
		return -1;
	return put(dir, "fuzz_sysfs", "gid-and-numa", b, sizeof(b));
}

/* rail-check: a description (verbs, one device) and two result rows. */
static int check_seeds(const char *dir)
{
	static struct rail_ck_info in;
	struct rail_ck_cell c[2] = { { .ra = 1, .rb = 0, .tested = 1, .ok = 1, .lat_us = 3.5,
				       .bw = 12.5 },
				     { .ra = 1, .da = 1, .rb = 0, .db = 1, .tested = 1 } };
	char b[4096];
	int n;

	in.rank = 1, in.want_rank = -1, in.ctrl_port = 4242, in.ndev = 1, in.nconf = 1;
	in.wire_handle = 1, in.wire_tcp = 1, in.wire_ib = 4;
	snprintf(in.host, sizeof(in.host), "node2");
	snprintf(in.version, sizeof(in.version), "0.2.0");
	snprintf(in.transport, sizeof(in.transport), "ib");
	snprintf(in.ctrl_host, sizeof(in.ctrl_host), "10.0.0.2");
	snprintf(in.conf[0].name, sizeof(in.conf[0].name), "NCCL_IB_TC");
	snprintf(in.conf[0].value, sizeof(in.conf[0].value), "-1");
	snprintf(in.dev[0].name, sizeof(in.dev[0].name), "mlx5_0:1");
	snprintf(in.dev[0].link, sizeof(in.dev[0].link), "RoCE");
	snprintf(in.dev[0].gid, sizeof(in.dev[0].gid), "::ffff:10.1.0.2");
	snprintf(in.dev[0].gid_type, sizeof(in.dev[0].gid_type), "RoCEv2");
	snprintf(in.dev[0].subnet, sizeof(in.dev[0].subnet), "10.1.0.0/24");
	in.dev[0].port = 1, in.dev[0].gid_index = 3, in.dev[0].mtu = 4096;
	in.dev[0].speed = 400000;
	n = rail_ck_info_encode(&in, b, sizeof(b));
	if (n < 0 || put(dir, "fuzz_check", "info-roce", b, (size_t)n))
		return -1;
	snprintf(c[1].step, sizeof(c[1].step), "connect");
	snprintf(c[1].why, sizeof(c[1].why), "this side: nothing within 10 s");
	n = rail_ck_cells_encode(c, 2, b, sizeof(b));
	return n < 0 ? -1 : put(dir, "fuzz_check", "cells", b, (size_t)n);
}

/* fuzz_rma_wire: a hello, a frame, a record and a window size, all valid. */
static int rma_seeds(const char *dir)
{
	struct rma_hello h = { .kind = RMA_LINK_DATA, .nonce = 0x1234, .rank = 1, .nranks = 4,
			       .seq = 2, .index = 1 };
	struct rma_frame f = { .op = RMA_OP_PUT, .win = 3, .off = 4096, .len = 8192 };
	struct rma_record r = { .index = 3, .nranks = 4, .base = 0x7f0000001000, .size = 1 << 20 };
	uint8_t b[RMA_HELLO_SIZE + RMA_FRAME_SIZE + RMA_RECORD_SIZE + 8];

	rma_hello_encode(&h, b);
	rma_frame_encode(&f, b + RMA_HELLO_SIZE);
	rma_record_encode(&r, b + RMA_HELLO_SIZE + RMA_FRAME_SIZE);
	rail_put_u64(b + RMA_HELLO_SIZE + RMA_FRAME_SIZE + RMA_RECORD_SIZE, 1 << 20);
	if (put(dir, "fuzz_rma_wire", "put", b, sizeof(b)))
		return -1;
	f = (struct rma_frame){ .op = RMA_OP_SIGNAL, .win = 4, .off = 8, .len = 1 };
	rma_frame_encode(&f, b + RMA_HELLO_SIZE);
	return put(dir, "fuzz_rma_wire", "signal", b, sizeof(b));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make-seeds DIR\n");
		return 64;
	}
	mkdir(argv[1], 0755);
	if (tcp_seeds(argv[1]) || handle_seeds(argv[1]) || ib_seeds(argv[1]) ||
	    text_seeds(argv[1]) || sysfs_seeds(argv[1]) || check_seeds(argv[1]) ||
	    rma_seeds(argv[1]))
		return 1;
	return 0;
}
