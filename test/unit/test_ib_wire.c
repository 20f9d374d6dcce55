/* nccl-net-rail unit tests: the verbs transport's wire formats (src/ib/ib_wire.c). */
#include "unit.h"

#include <errno.h>
#include <pthread.h>

#include "ib/ib_wire.h"
#include "rail.h"
#include "wire.h"

static struct rail_ib_msg sample(int type)
{
	struct rail_ib_msg m;

	memset(&m, 0, sizeof(m));
	m.type = type;
	m.nonce = 0x0123456789abcdefull;
	m.ndevs = 2;
	m.qps_per_dev = 2;
	m.tc = 106;
	m.sl = 3;
	m.nqps = type == RAIL_IB_MSG_HELLO ? 0 : 4;
	m.ctrl_addr = 0x7f0012345000ull;
	if (type == RAIL_IB_MSG_ACCEPT) {
		m.eager_slots = 64;
		m.eager_slot_bytes = 4160;
		m.eager_addr = 0x7f0012345840ull;
		m.aux_addr = 0x7f0012345800ull;
		m.nece = 2;	/* ECE: device 0 offers it, device 1 does not */
		m.ece[0] = (struct rail_ib_ece){ 0x15b3, 0x30000001u, 0 };
	} else if (type == RAIL_IB_MSG_READY) {
		m.aux_addr = 0x7f0012346000ull;
	}
	for (int i = 0; i < m.ndevs; i++) {
		m.devs[i].lid = (uint16_t)(10 + i);
		m.devs[i].port = 1;
		m.devs[i].link_layer = 2;
		m.devs[i].mtu = 3;
		m.devs[i].gid_index = (uint8_t)i;
		m.devs[i].devnum = (uint16_t)(4 - i);	/* device 3, then 2 (+ 1) */
		m.devs[i].ctrl_rkey = 0x1000u + (uint32_t)i;
		m.devs[i].gid[10] = m.devs[i].gid[11] = 0xff;
		m.devs[i].gid[15] = (uint8_t)(1 + i);
	}
	for (int i = 0; i < m.nqps; i++)
		m.qpn[i] = 0x11u + (uint32_t)i;
	return m;
}

static void test_msg_roundtrip(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	int types[] = { RAIL_IB_MSG_HELLO, RAIL_IB_MSG_ACCEPT, RAIL_IB_MSG_READY };
	char why[200];

	(void)state;
	for (size_t t = 0; t < RAIL_ARRAY_SIZE(types); t++) {
		struct rail_ib_msg m = sample(types[t]), out;
		int len = rail_ib_msg_encode(&m, buf, sizeof(buf));

		assert_true(len > RAIL_IB_HDR_SIZE);
		assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), 0);
		assert_int_equal(out.type, m.type);
		assert_true(out.nonce == m.nonce);
		assert_int_equal(out.ndevs, 2);
		assert_int_equal(out.nqps, m.nqps);
		assert_int_equal(out.tc, 106);
		assert_true(out.ctrl_addr == m.ctrl_addr);
		assert_true(out.eager_addr == m.eager_addr && out.aux_addr == m.aux_addr);
		assert_int_equal(out.eager_slots, m.eager_slots);
		assert_int_equal(out.eager_slot_bytes, m.eager_slot_bytes);
		assert_memory_equal(out.devs, m.devs, sizeof(m.devs[0]) * 2);
		assert_memory_equal(out.qpn, m.qpn, sizeof(m.qpn[0]) * (size_t)m.nqps);
		assert_int_equal(out.nece, m.nece);
		assert_memory_equal(out.ece, m.ece, sizeof(m.ece));
	}
}

static void test_refuse_text(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg m, out;
	char why[200];
	int len;

	(void)state;
	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_REFUSE;
	m.refuse_code = RAIL_IB_REFUSE_NONCE;
	rail_strlcpy(m.text, "nonce mismatch", sizeof(m.text));
	len = rail_ib_msg_encode(&m, buf, sizeof(buf));
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), 0);
	assert_string_equal(out.text, "nonce mismatch");
	assert_int_equal(out.refuse_code, RAIL_IB_REFUSE_NONCE);
}

static void test_msg_rejects(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg m = sample(RAIL_IB_MSG_ACCEPT), out;
	char why[200] = "";
	int len = rail_ib_msg_encode(&m, buf, sizeof(buf));

	(void)state;
	buf[0] ^= 1;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), -EPROTO);
	assert_non_null(strstr(why, "magic"));
	buf[0] ^= 1;
	buf[4] = 9;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)),
			 -EPROTONOSUPPORT);
	buf[4] = RAIL_IB_WIRE_VERSION;
	buf[RAIL_IB_HDR_SIZE + 30] ^= 0x40;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "checksum"));
	buf[RAIL_IB_HDR_SIZE + 30] ^= 0x40;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len - 1, &out, why, sizeof(why)),
			 -EBADMSG);
	/* an ECE count that is neither 0 nor the device count */
	buf[RAIL_IB_HDR_SIZE + len - RAIL_IB_HDR_SIZE - 2 * 12 - 1] = 1;
	rail_put_u32(buf + 12, rail_fnv1a(buf + RAIL_IB_HDR_SIZE, (size_t)len - RAIL_IB_HDR_SIZE));
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "ECE"));
	m.nece = 1;
	assert_int_equal(rail_ib_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
	m.nece = 0;
	m.ndevs = RAIL_MAX_VDEV_DEVS + 1;
	assert_int_equal(rail_ib_msg_encode(&m, buf, sizeof(buf)), -EINVAL);
}

/* Encode m, decode it: the decoder's result (out, why on failure). */
static int roundtrip(const struct rail_ib_msg *m, struct rail_ib_msg *out, char *why, size_t len)
{
	static uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	int n = rail_ib_msg_encode(m, buf, sizeof(buf));

	assert_true(n > RAIL_IB_HDR_SIZE);
	return rail_ib_msg_decode(buf, (size_t)n, out, why, len);
}

/* A MOVE keeps its state and flags; a flags word with more than 8 bits is refused. */
static void test_msg_move(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg m = sample(RAIL_IB_MSG_MOVE), out;
	char why[200] = "";
	int len;

	(void)state;
	m.move = (struct rail_ib_move_state){ .epoch = 3, .role = 1, .reason = 7,
					      .flags = RAIL_IB_MOVE_F_AVOID | RAIL_IB_MOVE_F_AWAY,
					      .seq = 99, .e_seen = 5, .e_head = 4, .nans = 4 };
	for (int i = 0; i < 4; i++)
		m.move.ans[i] = 90u + (uint64_t)i;
	assert_int_equal(roundtrip(&m, &out, why, sizeof(why)), 0);
	assert_int_equal(out.move.flags, RAIL_IB_MOVE_F_AVOID | RAIL_IB_MOVE_F_AWAY);
	assert_int_equal(out.move.reason, 7);
	assert_true(out.move.seq == 99 && out.move.ans[3] == 93);
	len = rail_ib_msg_encode(&m, buf, sizeof(buf));
	/* the flags' u32 sits 24 bytes into the move block, which ends with the 4 answers */
	buf[len - 4 * 8 - 4 + 1] = 1;
	rail_put_u32(buf + 12, rail_fnv1a(buf + RAIL_IB_HDR_SIZE, (size_t)len - RAIL_IB_HDR_SIZE));
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "move message corrupt"));
}

static struct rail_ib_msg probe(int type, uint32_t code)
{
	struct rail_ib_msg m = sample(type);

	m.ndevs = m.nqps = 1;
	m.nonce = 17;
	m.refuse_code = code;
	if (type == RAIL_IB_MSG_PROBE_DONE || code)
		m.ndevs = m.nqps = 0;
	if (type == RAIL_IB_MSG_PROBE_ACK && !code) {
		m.aux_addr = 0x1122334455667788ull;
		m.devs[0].ctrl_rkey = 0x4242;
	}
	if (code)
		snprintf(m.text, sizeof(m.text), "its home port mlx5_2:1 is down");
	return m;
}

/* The probe's messages: one device and one QP (an answer: none when refused); nothing else. */
static void test_msg_probe(void **state)
{
	struct rail_ib_msg out, bad;
	char why[200] = "";

	(void)state;
	bad = probe(RAIL_IB_MSG_PROBE, 0);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), 0);
	assert_true(out.type == RAIL_IB_MSG_PROBE && out.nonce == 17 && out.ndevs == 1 &&
		    out.nqps == 1 && out.qpn[0] == bad.qpn[0]);
	assert_memory_equal(&out.devs[0], &bad.devs[0], sizeof(bad.devs[0]));
	bad = probe(RAIL_IB_MSG_PROBE_ACK, 0);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), 0);
	assert_true(out.aux_addr == 0x1122334455667788ull && out.devs[0].ctrl_rkey == 0x4242 &&
		    out.ctrl_addr == bad.ctrl_addr);
	bad = probe(RAIL_IB_MSG_PROBE_ACK, RAIL_IB_PROBE_REFUSED);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), 0);
	assert_string_equal(out.text, "its home port mlx5_2:1 is down");
	bad = probe(RAIL_IB_MSG_PROBE_DONE, 0);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), 0);
	bad = probe(RAIL_IB_MSG_PROBE_DONE, RAIL_IB_PROBE_FAILED);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), 0);
	assert_int_equal(out.refuse_code, RAIL_IB_PROBE_FAILED);
	/* refused: the shapes that do not fit */
	bad = probe(RAIL_IB_MSG_PROBE, 0);
	bad.ndevs = 2;
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	bad = probe(RAIL_IB_MSG_PROBE, RAIL_IB_PROBE_FAILED);
	bad.ndevs = bad.nqps = 1;
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	bad = probe(RAIL_IB_MSG_PROBE_ACK, RAIL_IB_PROBE_REFUSED);
	bad.ndevs = bad.nqps = 1;
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	bad = probe(RAIL_IB_MSG_PROBE_DONE, 3);
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	bad = probe(RAIL_IB_MSG_PROBE_DONE, 0);
	bad.nqps = 1;
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "handshake type 9"));
	bad = probe(RAIL_IB_MSG_PROBE_DONE, 0);
	bad.type = RAIL_IB_MSG_LAST + 1;
	assert_int_equal(roundtrip(&bad, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "header corrupt"));
}

/* An ACCEPT's eager ring and a READY's credit word are checked like every field. */
static void test_msg_eager_rejects(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg bad[7], out;
	char why[200];

	(void)state;
	for (int i = 0; i < 5; i++)
		bad[i] = sample(RAIL_IB_MSG_ACCEPT);
	bad[0].eager_slots = 48;		/* not a power of two */
	bad[1].eager_slot_bytes = 4100;		/* not a multiple of 64 */
	bad[2].eager_slot_bytes = 1u << 20;	/* too large */
	bad[3].eager_addr = 0;
	bad[4].aux_addr = 0;
	bad[5] = sample(RAIL_IB_MSG_READY);
	bad[5].aux_addr = 0;
	bad[6] = sample(RAIL_IB_MSG_READY);
	bad[6].flags = 3;			/* no such eager ring order */
	for (int i = 0; i < 7; i++) {
		int len = rail_ib_msg_encode(&bad[i], buf, sizeof(buf));

		assert_true(len > 0);
		assert_int_equal(rail_ib_msg_decode(buf, (size_t)len, &out, why, sizeof(why)),
				 -EBADMSG);
		assert_true(strstr(why, "eager") || strstr(why, "credit"));
	}
	/* No eager ring at all is fine: the receiver then sends a CTS for everything. */
	bad[0].eager_slots = 0;
	bad[0].eager_addr = bad[0].aux_addr = 0;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)rail_ib_msg_encode(&bad[0], buf, sizeof(buf)),
					    &out, why, sizeof(why)), 0);
	assert_int_equal(out.eager_slots, 0);
	/* The sender's eager ring order travels in READY's flags. */
	bad[6].flags = RAIL_IB_ORDER_SAFE;
	assert_int_equal(rail_ib_msg_decode(buf, (size_t)rail_ib_msg_encode(&bad[6], buf, sizeof(buf)),
					    &out, why, sizeof(why)), 0);
	assert_int_equal(out.flags & RAIL_IB_READY_ORDER_MASK, RAIL_IB_ORDER_SAFE);
}

/* Mutated frames decode or fail cleanly; a valid checksum over garbage must not crash. */
static void test_msg_fuzz(void **state)
{
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	struct rail_ib_msg m = sample(RAIL_IB_MSG_ACCEPT), out;
	uint32_t seed = 12345;
	char why[200];
	int len = rail_ib_msg_encode(&m, buf, sizeof(buf));

	(void)state;
	for (int it = 0; it < 20000; it++) {
		uint8_t copy[sizeof(buf)];
		int flips = 1 + it % 4;

		memcpy(copy, buf, sizeof(buf));
		for (int f = 0; f < flips; f++) {
			seed = seed * 1103515245u + 12345u;
			copy[RAIL_IB_HDR_SIZE + (seed >> 8) % (uint32_t)(len - RAIL_IB_HDR_SIZE)] ^=
				(uint8_t)(seed >> 24);
		}
		/* Re-seal so the decoder's field checks, not the checksum, are exercised. */
		{
			uint32_t body = (uint32_t)(len - RAIL_IB_HDR_SIZE);
			uint32_t h = 2166136261u;

			for (uint32_t i = 0; i < body; i++)
				h = (h ^ copy[RAIL_IB_HDR_SIZE + i]) * 16777619u;
			for (int i = 0; i < 4; i++)
				copy[12 + i] = (uint8_t)(h >> (8 * i));
		}
		int err = rail_ib_msg_decode(copy, (size_t)len, &out, why, sizeof(why));

		assert_true(err == 0 || err == -EBADMSG);
		if (!err) {
			uint32_t n = (uint32_t)out.eager_slots;

			assert_true(out.ndevs <= RAIL_MAX_VDEV_DEVS);
			assert_true(out.nqps <= RAIL_IB_WIRE_MAX_QPS);
			/* an accepted ring is always usable */
			assert_true(n == 0 || ((n & (n - 1)) == 0 && out.eager_slot_bytes >= 64 &&
					       out.eager_slot_bytes <= RAIL_IB_EAGER_MAX_SLOT_BYTES &&
					       out.eager_addr && out.aux_addr));
		}
	}
}

static void test_cts(void **state)
{
	uint8_t e[RAIL_IB_CTS_SIZE];
	struct rail_ib_cts c, out;
	char why[200];

	(void)state;
	memset(&c, 0, sizeof(c));
	c.addr = 0x7f00dead0000ull;
	c.size = 1 << 20;
	c.rkey[0] = 0xabc;
	c.rkey[7] = 0xdef;
	c.tag = -5;
	c.nreqs = 3;
	c.idx = 2;
	c.ord = 0xfffffffeu;
	c.credits = 777;
	c.seq = 42;
	rail_ib_cts_encode(&c, e);
	assert_true(rail_ib_cts_seq(e) == 42);
	assert_int_equal(rail_ib_cts_decode(e, 41, 2, &out, why, sizeof(why)), -EAGAIN);
	assert_int_equal(rail_ib_cts_decode(e, 42, 2, &out, why, sizeof(why)), 0);
	assert_true(out.addr == c.addr && out.size == c.size);
	assert_int_equal(out.tag, -5);
	assert_int_equal(out.rkey[7], 0xdef);
	assert_true(out.ord == 0xfffffffeu && out.credits == 777);
	assert_int_equal(rail_ib_cts_decode(e, 42, 1, &out, why, sizeof(why)), -EBADMSG);
	e[52] = 9; /* nreqs beyond 8 */
	assert_int_equal(rail_ib_cts_decode(e, 42, 2, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "corrupt"));
	e[52] = 3;
	c.size = RAIL_MAX_MSG_BYTES + 1;	/* beyond 1 GiB */
	rail_ib_cts_encode(&c, e);
	assert_int_equal(rail_ib_cts_decode(e, 42, 2, &out, why, sizeof(why)), -EBADMSG);
}

/*
 * A CTS landing while another thread polls it, as the move thread does: the
 * writer stores each entry the way the fake provider models a NIC's DMA
 * (aligned 8-byte release stores in address order, the seq in the last
 * word), the reader waits for the seq and decodes. Every field must be the
 * entry's own, and under ThreadSanitizer (make test-tsan) the body's reads
 * must be ordered after the writer's stores by the seq's load: a 4-byte
 * load of the seq's half of the last word paired with no store and was
 * reported as a race on the body.
 */
#define LAND_ROUNDS 2000
static _Alignas(64) uint8_t land_slot[RAIL_IB_CTS_SIZE];
static uint32_t land_ack;	/* the last seq the reader decoded */

static void *land_writer(void *arg)
{
	(void)arg;
	for (uint32_t n = 1; n <= LAND_ROUNDS; n++) {
		struct rail_ib_cts c = { .addr = (uint64_t)n << 20, .size = n * 3u, .ord = n,
					 .tag = (int)n, .nreqs = 1, .idx = 0, .credits = n + 7,
					 .seq = n };
		_Alignas(8) uint8_t e[RAIL_IB_CTS_SIZE];

		for (int k = 0; k < RAIL_MAX_VDEV_DEVS; k++)
			c.rkey[k] = n * 11u + (uint32_t)k;
		rail_ib_cts_encode(&c, e);
		while (__atomic_load_n(&land_ack, __ATOMIC_ACQUIRE) != n - 1)
			;
		for (int i = 0; i < RAIL_IB_CTS_SIZE; i += 8) {
			uint64_t w;

			memcpy(&w, e + i, 8);
			__atomic_store_n((uint64_t *)(void *)(land_slot + i), w, __ATOMIC_RELEASE);
		}
	}
	return NULL;
}

static void test_cts_lands_while_polled(void **state)
{
	pthread_t t;
	char why[200];

	(void)state;
	memset(land_slot, 0, sizeof(land_slot));
	land_ack = 0;
	assert_int_equal(pthread_create(&t, NULL, land_writer, NULL), 0);
	for (uint32_t n = 1; n <= LAND_ROUNDS; n++) {
		struct rail_ib_cts out;
		int err;

		while ((err = rail_ib_cts_decode(land_slot, n, 0, &out, why, sizeof(why))) == -EAGAIN)
			;
		assert_int_equal(err, 0);
		assert_true(out.addr == (uint64_t)n << 20 && out.size == n * 3u && out.ord == n);
		assert_true(out.tag == (int)n && out.credits == n + 7 && out.rkey[3] == n * 11u + 3);
		__atomic_store_n(&land_ack, n, __ATOMIC_RELEASE);
	}
	assert_int_equal(pthread_join(t, NULL), 0);
}

/* Random CTS entries with a matching seq: decoded within limits or refused. */
static void test_cts_fuzz(void **state)
{
	uint8_t e[RAIL_IB_CTS_SIZE];
	struct rail_ib_cts out;
	uint32_t x = 99;
	char why[200];

	(void)state;
	for (int it = 0; it < 20000; it++) {
		int err;

		for (int i = 0; i < RAIL_IB_CTS_SIZE; i++) {
			x = x * 1103515245u + 12345u;
			e[i] = (uint8_t)(x >> 16);
		}
		if (it & 1)
			e[52] = (uint8_t)(1 + it % 8);	/* often a plausible nreqs */
		err = rail_ib_cts_decode(e, rail_ib_cts_seq(e), it % 8, &out, why, sizeof(why));
		assert_true(err == 0 || err == -EBADMSG);
		if (!err)
			assert_true(out.nreqs >= 1 && out.nreqs <= RAIL_MAX_RECVS &&
				    out.idx < out.nreqs && out.size <= RAIL_MAX_MSG_BYTES);
	}
}

static void test_imm(void **state)
{
	uint64_t v;
	int idx;

	(void)state;
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_single(12345), &v, &idx), RAIL_IB_IMM_SIZE);
	assert_true(v == 12345);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_single(RAIL_MAX_MSG_BYTES), &v, &idx),
			 RAIL_IB_IMM_SIZE);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_multi(8), &v, &idx), RAIL_IB_IMM_COUNT);
	assert_true(v == 8);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_refused(5, 1000), &v, &idx),
			 RAIL_IB_IMM_REFUSAL);
	assert_int_equal(idx, 5);
	assert_true(v == 1000);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_refused(7, 1ull << 31), &v, &idx),
			 RAIL_IB_IMM_REFUSAL);
	assert_true(v == RAIL_IB_IMM_REFUSED_SIZE_MAX);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_eager(), &v, &idx), RAIL_IB_IMM_EAGER);
	/* an eager message written with immediate: the low 29 bits of its seq */
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_ring(1), &v, &idx), RAIL_IB_IMM_RING_MSG);
	assert_int_equal(v, 1);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_ring(0xfffffffeu), &v, &idx),
			 RAIL_IB_IMM_RING_MSG);
	assert_int_equal(v, 0x1ffffffe);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_ring(0), &v, &idx), RAIL_IB_IMM_RING_MSG);
	assert_int_equal(v, 0);
	/* no other kind decodes as a ring message */
	assert_int_not_equal(rail_ib_imm_decode(rail_ib_imm_refused(1, 100), &v, &idx),
			     RAIL_IB_IMM_RING_MSG);
	assert_int_not_equal(rail_ib_imm_decode(rail_ib_imm_multi(2), &v, &idx),
			     RAIL_IB_IMM_RING_MSG);
	assert_int_equal(rail_ib_imm_decode(rail_ib_imm_multi(9), &v, &idx), -EBADMSG);
	assert_int_equal(rail_ib_imm_decode(RAIL_IB_IMM_MULTI | 1, &v, &idx), -EBADMSG);
	assert_int_equal(rail_ib_imm_decode(0x7ffffffe, &v, &idx), -EBADMSG);
	assert_int_equal(rail_ib_imm_decode(RAIL_MAX_MSG_BYTES + 1, &v, &idx), -EBADMSG);
}

static void test_sizes(void **state)
{
	uint32_t in[4] = { 0, 7, 1u << 30, RAIL_IB_SIZE_EAGER }, out[4];
	uint8_t buf[16];

	(void)state;
	rail_ib_sizes_encode(in, 4, buf);
	assert_int_equal(rail_ib_sizes_decode(buf, 4, out), 0);
	assert_memory_equal(in, out, sizeof(in));
	in[1] = (1u << 30) + 1;	/* neither a size nor EAGER */
	rail_ib_sizes_encode(in, 4, buf);
	assert_int_equal(rail_ib_sizes_decode(buf, 4, out), -EBADMSG);
}

static void test_eager_trailer(void **state)
{
	uint8_t slot[64];
	struct rail_ib_eager_hdr h = { .size = 8, .tag = -3, .ord = 0xffffffffu, .seq = 5 }, out;
	char why[200] = "";

	(void)state;
	memset(slot, 0, sizeof(slot));
	/* A slot never written (zeros) holds no message. */
	assert_int_equal(rail_ib_eager_decode(slot + 48, 1, 4096, &out, why, sizeof(why)), -EAGAIN);
	rail_ib_eager_encode(&h, slot + 48);
	assert_int_equal(rail_ib_eager_decode(slot + 48, 4, 4096, &out, why, sizeof(why)), -EAGAIN);
	assert_int_equal(rail_ib_eager_decode(slot + 48, 5, 4096, &out, why, sizeof(why)), 0);
	assert_true(out.size == 8 && out.tag == -3 && out.ord == 0xffffffffu && out.seq == 5);
	h.size = 4097;	/* more than the slot holds */
	rail_ib_eager_encode(&h, slot + 48);
	assert_int_equal(rail_ib_eager_decode(slot + 48, 5, 4096, &out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "4097"));
}

/* Garbage in a ring slot whose seq matches: the size, the one thing used, is checked. */
static void test_eager_fuzz(void **state)
{
	uint8_t t[RAIL_IB_EAGER_TRAILER];
	struct rail_ib_eager_hdr out;
	uint32_t x = 7;
	char why[200];

	(void)state;
	for (int it = 0; it < 20000; it++) {
		int err;

		for (int i = 0; i < RAIL_IB_EAGER_TRAILER; i++) {
			x = x * 1103515245u + 12345u;
			t[i] = (uint8_t)(x >> 16);
		}
		if (it & 1)
			t[2] = t[3] = 0;	/* often a plausible size */
		err = rail_ib_eager_decode(t, (uint32_t)t[12] | (uint32_t)t[13] << 8 |
						      (uint32_t)t[14] << 16 | (uint32_t)t[15] << 24,
					   4144, &out, why, sizeof(why));
		assert_true(err == 0 || err == -EBADMSG);
		if (!err)
			assert_true(out.size <= 4144);
	}
}

/*
 * LL images: any word not yet placed, or left from an older message, keeps
 * the message from being taken (the order-safe protocol for small
 * messages: words may land in any order); a whole image decodes to the
 * exact bytes; a size above the limits is refused.
 */
static void test_ll(void **state)
{
	static const uint32_t sizes[] = { 0, 1, 3, 4, 5, 8, 63, 100, RAIL_IB_LL_MAX };
	uint8_t img[RAIL_IB_LL_BYTES], old[RAIL_IB_LL_BYTES], slot[RAIL_IB_LL_BYTES + 8];
	uint8_t payload[RAIL_IB_LL_MAX], out[RAIL_IB_LL_MAX];
	struct rail_ib_eager_hdr h, got;
	char why[200];

	(void)state;
	assert_true(rail_ib_ll_bytes(RAIL_IB_LL_MAX) <= RAIL_IB_LL_BYTES);
	for (size_t k = 0; k < RAIL_ARRAY_SIZE(sizes); k++) {
		uint32_t size = sizes[k], len, words;
		uint8_t *end = slot + sizeof(slot);
		/* the same slot's message `slots` earlier, as large as the LL region allows */
		struct rail_ib_eager_hdr o = { .size = RAIL_IB_LL_MAX, .tag = 9, .ord = 2,
					       .seq = 7 };

		for (uint32_t i = 0; i < RAIL_IB_LL_MAX; i++)
			payload[i] = (uint8_t)(0x5a ^ (i * 7 + k));
		h.size = size;
		h.tag = -3;
		h.ord = 0xfffffffeu;
		h.seq = 7 + 64;
		len = rail_ib_ll_encode(&h, payload, img);
		assert_int_equal(len, rail_ib_ll_bytes(size));
		words = len / 8;
		(void)rail_ib_ll_encode(&o, payload, old);
		memset(slot, 0, sizeof(slot));
		memcpy(slot + 8, old, sizeof(old));	/* ends at the slot end, like the new one */

		assert_false(rail_ib_ll_ready(end, h.seq));
		assert_int_equal(rail_ib_ll_decode(end, h.seq, 4096, &got, out + RAIL_IB_LL_MAX, why,
						   sizeof(why)),
				 -EAGAIN);
		/* every word but one placed: never taken */
		for (uint32_t miss = 0; miss < words; miss++) {
			memcpy(slot + 8, old, sizeof(old));
			for (uint32_t w = 0; w < words; w++)
				if (w != miss)
					memcpy(end - len + 8 * w, img + 8 * w, 8);
			assert_int_equal(rail_ib_ll_decode(end, h.seq, 4096, &got, out + RAIL_IB_LL_MAX, why,
							   sizeof(why)), -EAGAIN);
			assert_int_equal(rail_ib_ll_ready(end, h.seq), miss != words - 1);
		}
		memcpy(end - len, img, len);
		memset(out, 0xee, sizeof(out));
		assert_int_equal(rail_ib_ll_decode(end, h.seq, 4096, &got, out + RAIL_IB_LL_MAX, why,
						   sizeof(why)), 0);
		assert_int_equal(got.size, size);
		assert_int_equal(got.tag, -3);
		assert_int_equal(got.ord, 0xfffffffeu);
		assert_int_equal(got.seq, h.seq);
		/* the payload ends where asked, and nothing before it is written */
		assert_memory_equal(out + RAIL_IB_LL_MAX - size, payload, size);
		if (size < RAIL_IB_LL_MAX)
			assert_int_equal(out[RAIL_IB_LL_MAX - size - 1], 0xee);
		/* a seq other than the image's is not it */
		assert_int_equal(rail_ib_ll_decode(end, h.seq + 1, 4096, &got, out + RAIL_IB_LL_MAX, why,
						   sizeof(why)), -EAGAIN);
		if (size)	/* above the receiver's eager limit */
			assert_int_equal(rail_ib_ll_decode(end, h.seq, size - 1, &got, out + RAIL_IB_LL_MAX, why,
							   sizeof(why)), -EBADMSG);
	}
	/* A size word larger than any LL image: corrupt, named. */
	h.size = RAIL_IB_LL_MAX + 4;
	h.seq = 3;
	(void)rail_ib_ll_encode(&(struct rail_ib_eager_hdr){ .size = 0, .seq = 3 }, payload, img);
	memcpy(slot + sizeof(slot) - 24, img, 24);
	slot[sizeof(slot) - 8] = (uint8_t)(RAIL_IB_LL_MAX + 4);
	slot[sizeof(slot) - 7] = 0;
	assert_int_equal(rail_ib_ll_decode(slot + sizeof(slot), 3, 4096, &got, out + RAIL_IB_LL_MAX, why,
					   sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "LL image"));
}

static void test_want_credit(void **state)
{
	uint8_t w[RAIL_IB_WANT_SIZE], c[RAIL_IB_CREDIT_SIZE] __attribute__((aligned(8)));
	struct rail_ib_want in = { .tag = 12, .ord = 0x80000001u, .seq = 3 }, out;
	uint32_t consumed;
	uint16_t ack, flags;

	(void)state;
	memset(c, 0, sizeof(c));
	rail_ib_credit_decode(c, &consumed, &ack, &flags);
	assert_int_equal(flags & RAIL_IB_CREDIT_READY, 0);	/* never written: not ready */
	memset(w, 0, sizeof(w));
	assert_int_equal(rail_ib_want_decode(w, 0, &out), -EAGAIN);
	rail_ib_want_encode(&in, w);
	assert_int_equal(rail_ib_want_decode(w, 3, &out), -EAGAIN);
	assert_int_equal(rail_ib_want_decode(w, 2, &out), 0);
	assert_true(out.tag == 12 && out.ord == 0x80000001u && out.seq == 3);
	rail_ib_credit_encode(0xfffffff0u, 9, 0, c);
	rail_ib_credit_decode(c, &consumed, &ack, &flags);
	assert_true(consumed == 0xfffffff0u && ack == 9 && flags == RAIL_IB_CREDIT_READY);
	/* the order-safe eager protocol rides in every credit word */
	rail_ib_credit_encode(5, 1, RAIL_IB_CREDIT_SAFE, c);
	rail_ib_credit_decode(c, &consumed, &ack, &flags);
	assert_true(consumed == 5 && ack == 1 &&
		    flags == (RAIL_IB_CREDIT_READY | RAIL_IB_CREDIT_SAFE));
}

/* The handle's payload: the listener's GIDs (NCCL_IB_SUBNET_AWARE_ROUTING), at most two. */
static void test_handle_gids(void **state)
{
	uint8_t in[3][16], out[RAIL_IB_HANDLE_GIDS][16], payload[64];

	(void)state;
	for (int i = 0; i < 3; i++)
		memset(in[i], 0x11 * (i + 1), 16);
	assert_int_equal(rail_ib_handle_gids_encode(in, 3, payload), 32);
	assert_int_equal(rail_ib_handle_gids_decode(payload, 32, out), 2);
	assert_memory_equal(out, in, 32);
	assert_int_equal(rail_ib_handle_gids_encode(in, 0, payload), 0);
	assert_int_equal(rail_ib_handle_gids_decode(payload, 0, out), 0);
	assert_int_equal(rail_ib_handle_gids_decode(payload, 17, out), -EBADMSG);
	assert_int_equal(rail_ib_handle_gids_decode(payload, 48, out), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_msg_roundtrip),	  cmocka_unit_test(test_refuse_text),
		cmocka_unit_test(test_msg_rejects),	  cmocka_unit_test(test_msg_eager_rejects),
		cmocka_unit_test(test_msg_fuzz),	  cmocka_unit_test(test_cts),
		cmocka_unit_test(test_cts_fuzz),
		cmocka_unit_test(test_cts_lands_while_polled),	  cmocka_unit_test(test_imm),
		cmocka_unit_test(test_sizes),		  cmocka_unit_test(test_eager_trailer),
		cmocka_unit_test(test_eager_fuzz),	  cmocka_unit_test(test_want_credit),
		cmocka_unit_test(test_ll),		  cmocka_unit_test(test_msg_move),
		cmocka_unit_test(test_msg_probe),	  cmocka_unit_test(test_handle_gids),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
