/* nccl-net-rail unit tests: the connection handle (src/handle.c) and wire helpers (src/wire.h). */
#include "unit.h"

#include <arpa/inet.h>
#include <errno.h>

#include "handle.h"
#include "rail.h"
#include "sock.h"
#include "wire.h"

static struct rail_handle make_v4(void)
{
	struct rail_handle h;

	memset(&h, 0, sizeof(h));
	h.transport = RAIL_TRANSPORT_TCP;
	h.nonce = 0x0123456789abcdefull;
	h.addr.sin.sin_family = AF_INET;
	h.addr.sin.sin_port = htons(43122);
	assert_int_equal(inet_pton(AF_INET, "10.1.2.3", &h.addr.sin.sin_addr), 1);
	h.payload_len = 5;
	memcpy(h.payload, "hello", 5);
	return h;
}

static struct rail_handle make_v6(void)
{
	struct rail_handle h;

	memset(&h, 0, sizeof(h));
	h.transport = RAIL_TRANSPORT_IB;
	h.nonce = 0xfedcba9876543210ull;
	h.addr.sin6.sin6_family = AF_INET6;
	h.addr.sin6.sin6_port = htons(9);
	h.addr.sin6.sin6_scope_id = 0x01020304u;
	assert_int_equal(inet_pton(AF_INET6, "fe80::1:2:3:4", &h.addr.sin6.sin6_addr), 1);
	h.payload_len = RAIL_HANDLE_PAYLOAD_MAX;
	for (int i = 0; i < RAIL_HANDLE_PAYLOAD_MAX; i++)
		h.payload[i] = (uint8_t)(0xa0 + i);
	return h;
}

static void encode(const struct rail_handle *h, uint8_t buf[RAIL_HANDLE_SIZE])
{
	memset(buf, 0xee, RAIL_HANDLE_SIZE);
	assert_int_equal(rail_handle_encode(h, buf, RAIL_HANDLE_SIZE), 0);
}

/* Recompute the checksum after editing a field, to reach the checks behind it. */
static void reseal(uint8_t *buf)
{
	rail_put_u32(buf + 72, rail_fnv1a(buf, 72));
}

/* Decode must fail with err, explain itself, and leave *out alone. */
static void expect_decode_error(const uint8_t *buf, size_t len, int err, const char *why_has)
{
	struct rail_handle out, before;
	char why[256] = "";
	int got;

	memset(&out, 0x77, sizeof(out));
	before = out;
	got = rail_handle_decode(buf, len, &out, why, sizeof(why));
	if (got != err)
		fail_msg("decode returned %d, expected %d (why: %s)", got, err, why);
	if (why[0] == '\0')
		fail_msg("decode error %d without a reason", err);
	if (why_has && !strstr(why, why_has))
		fail_msg("reason '%s' does not mention '%s'", why, why_has);
	if (memcmp(&out, &before, sizeof(out)))
		fail_msg("decode wrote its output on error %d", err);
}

static void assert_same_handle(const struct rail_handle *a, const struct rail_handle *b)
{
	assert_int_equal(a->transport, b->transport);
	assert_true(a->nonce == b->nonce);
	assert_int_equal(a->addr.sa.sa_family, b->addr.sa.sa_family);
	assert_int_equal(rail_sockaddr_port(&a->addr), rail_sockaddr_port(&b->addr));
	if (a->addr.sa.sa_family == AF_INET) {
		assert_memory_equal(&a->addr.sin.sin_addr, &b->addr.sin.sin_addr, 4);
	} else {
		assert_memory_equal(&a->addr.sin6.sin6_addr, &b->addr.sin6.sin6_addr, 16);
		assert_int_equal(a->addr.sin6.sin6_scope_id, b->addr.sin6.sin6_scope_id);
	}
	assert_int_equal(a->payload_len, b->payload_len);
	assert_memory_equal(a->payload, b->payload, a->payload_len);
}

static void test_roundtrip_ipv4(void **state)
{
	struct rail_handle h = make_v4(), out;
	uint8_t buf[RAIL_HANDLE_SIZE];
	char why[128] = "";

	(void)state;
	encode(&h, buf);
	memset(&out, 0x55, sizeof(out));
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_same_handle(&h, &out);
	assert_string_equal(RAIL_ADDRSTR(&out.addr), "10.1.2.3:43122");
	/* Bytes past the payload are zero in the decoded handle. */
	for (int i = out.payload_len; i < RAIL_HANDLE_PAYLOAD_MAX; i++)
		assert_int_equal(out.payload[i], 0);
}

static void test_roundtrip_ipv6_scope(void **state)
{
	struct rail_handle h = make_v6(), out;
	uint8_t buf[RAIL_HANDLE_SIZE];
	char why[128] = "";

	(void)state;
	encode(&h, buf);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_same_handle(&h, &out);
	assert_int_equal(out.addr.sin6.sin6_scope_id, 0x01020304u);
	assert_int_equal(out.transport, RAIL_TRANSPORT_IB);
}

static void test_roundtrip_empty_payload(void **state)
{
	struct rail_handle h = make_v4(), out;
	uint8_t buf[RAIL_HANDLE_SIZE];
	char why[128] = "";

	(void)state;
	h.payload_len = 0;
	memset(h.payload, 0, sizeof(h.payload));
	encode(&h, buf);
	/* Only the 76 wire bytes are needed to decode. */
	assert_int_equal(rail_handle_decode(buf, RAIL_HANDLE_WIRE_SIZE, &out, why, sizeof(why)), 0);
	assert_same_handle(&h, &out);
}

/* The byte layout is a contract between nodes: pin it. */
static void test_wire_layout(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, buf);
	assert_memory_equal(buf, "RAIL", 4);
	assert_int_equal(rail_get_u16(buf + 4), RAIL_HANDLE_VERSION);
	assert_int_equal(buf[6], RAIL_TRANSPORT_TCP);
	assert_int_equal(buf[7], 4);
	assert_true(rail_get_u64(buf + 8) == 0x0123456789abcdefull);
	assert_int_equal(buf[8], 0xef); /* little-endian */
	assert_int_equal(rail_get_u16(buf + 16), 43122);
	assert_int_equal(rail_get_u16(buf + 18), 5);
	assert_int_equal(rail_get_u32(buf + 20), 0); /* no scope for IPv4 */
	assert_memory_equal(buf + 24, "\x0a\x01\x02\x03", 4);
	assert_memory_equal(buf + 40, "hello", 5);
	assert_true(rail_get_u32(buf + 72) == rail_fnv1a(buf, 72));
	/* After the wire bytes: this build's release, everything else zero, stage slot included. */
	assert_string_equal((char *)buf + RAIL_HANDLE_RELEASE_OFFSET, RAIL_VERSION_STRING);
	for (int i = RAIL_HANDLE_WIRE_SIZE; i < RAIL_HANDLE_SIZE; i++)
		if (buf[i] && (i < RAIL_HANDLE_RELEASE_OFFSET ||
			       i >= RAIL_HANDLE_RELEASE_OFFSET + (int)strlen(RAIL_VERSION_STRING)))
			fail_msg("byte %d is 0x%02x after encode, expected 0", i, buf[i]);
	assert_true(RAIL_HANDLE_RELEASE_OFFSET >= RAIL_HANDLE_WIRE_SIZE);
	assert_true(RAIL_HANDLE_RELEASE_OFFSET + RAIL_HANDLE_RELEASE_MAX <= RAIL_HANDLE_STAGE_OFFSET);
	assert_null(rail_handle_get_stage(buf));
	/* The stage slot fits in the handle. */
	assert_true(RAIL_HANDLE_STAGE_OFFSET >= RAIL_HANDLE_WIRE_SIZE);
	assert_true(RAIL_HANDLE_STAGE_OFFSET + sizeof(void *) <= RAIL_HANDLE_SIZE);
	assert_true(RAIL_HANDLE_SIZE <= NCCL_NET_HANDLE_MAXSIZE);

	/* Bytes past payload_len in the caller's struct do not leak into the handle. */
	memset(h.payload + h.payload_len, 0xaa, RAIL_HANDLE_PAYLOAD_MAX - h.payload_len);
	encode(&h, buf);
	for (int i = 40 + h.payload_len; i < 72; i++)
		if (buf[i])
			fail_msg("byte %d is 0x%02x after a %u-byte payload, expected 0", i, buf[i],
				 h.payload_len);

	h = make_v6();
	encode(&h, buf);
	assert_int_equal(buf[6], RAIL_TRANSPORT_IB);
	assert_int_equal(buf[7], 6);
	assert_true(rail_get_u32(buf + 20) == 0x01020304u);
	assert_int_equal(buf[24], 0xfe);
	assert_int_equal(buf[25], 0x80);
}

static void test_encode_rejects(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE], before[RAIL_HANDLE_SIZE];

	(void)state;
	memset(buf, 0xee, sizeof(buf));
	memcpy(before, buf, sizeof(buf));
	assert_int_equal(rail_handle_encode(&h, buf, RAIL_HANDLE_SIZE - 1), -EINVAL);
	h.payload_len = RAIL_HANDLE_PAYLOAD_MAX + 1;
	assert_int_equal(rail_handle_encode(&h, buf, sizeof(buf)), -EINVAL);
	h = make_v4();
	h.addr.sa.sa_family = AF_UNIX;
	assert_int_equal(rail_handle_encode(&h, buf, sizeof(buf)), -EINVAL);
	h.addr.sa.sa_family = AF_UNSPEC;
	assert_int_equal(rail_handle_encode(&h, buf, sizeof(buf)), -EINVAL);
	/* Failed encodes leave the buffer alone. */
	assert_memory_equal(buf, before, sizeof(buf));
}

static void test_truncated(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, buf);
	expect_decode_error(buf, RAIL_HANDLE_WIRE_SIZE - 1, -EMSGSIZE, "truncated");
	expect_decode_error(buf, RAIL_HANDLE_WIRE_SIZE - 1, -EMSGSIZE, "75");
	expect_decode_error(buf, 0, -EMSGSIZE, "truncated");
	expect_decode_error(buf, 4, -EMSGSIZE, NULL);
}

static void test_wrong_magic(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, buf);
	memcpy(buf, "NCCL", 4);
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EPROTO, "magic");
	expect_decode_error(buf, sizeof(buf), -EPROTO, "plugin");
	/* A handle of all zeroes (another plugin's, or an uninitialized one). */
	memset(buf, 0, sizeof(buf));
	expect_decode_error(buf, sizeof(buf), -EPROTO, "0x00000000");
}

static void test_wrong_version(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, buf);
	rail_put_u16(buf + 4, RAIL_HANDLE_VERSION + 1);
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EPROTONOSUPPORT, "version 2");
	expect_decode_error(buf, sizeof(buf), -EPROTONOSUPPORT, RAIL_VERSION_STRING);
	rail_put_u16(buf + 4, 0);
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EPROTONOSUPPORT, "version 0");
}

/*
 * The listener's release rides beside the checked bytes: decoded when
 * sound, "" when absent (older releases) or garbled, and named when the
 * format version does not match.
 */
static void test_release(void **state)
{
	struct rail_handle h = make_v4(), out;
	uint8_t buf[RAIL_HANDLE_SIZE];
	char why[256];

	(void)state;
	encode(&h, buf);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_string_equal(out.release, RAIL_VERSION_STRING);
	/* a short buffer (the 76 wire bytes only) decodes, without a release */
	assert_int_equal(rail_handle_decode(buf, RAIL_HANDLE_WIRE_SIZE, &out, why, sizeof(why)), 0);
	assert_string_equal(out.release, "");
	/* an older release left zeros */
	memset(buf + RAIL_HANDLE_RELEASE_OFFSET, 0, RAIL_HANDLE_RELEASE_MAX);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_string_equal(out.release, "");
	/* garbled: not printable, or not terminated */
	memcpy(buf + RAIL_HANDLE_RELEASE_OFFSET, "0.\x01", 4);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_string_equal(out.release, "");
	memset(buf + RAIL_HANDLE_RELEASE_OFFSET, 'x', RAIL_HANDLE_RELEASE_MAX);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_string_equal(out.release, "");
	/* another format version: both releases named */
	memset(buf + RAIL_HANDLE_RELEASE_OFFSET, 0, RAIL_HANDLE_RELEASE_MAX);
	memcpy(buf + RAIL_HANDLE_RELEASE_OFFSET, "9.8.7", 5);
	rail_put_u16(buf + 4, RAIL_HANDLE_VERSION + 1);
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EPROTONOSUPPORT,
			    "from a listener running nccl-net-rail 9.8.7, this plugin (" RAIL_VERSION_STRING);
	memset(buf + RAIL_HANDLE_RELEASE_OFFSET, 0, RAIL_HANDLE_RELEASE_MAX);
	expect_decode_error(buf, sizeof(buf), -EPROTONOSUPPORT, "(an older release)");
}

static int expected_flip_error(int offset)
{
	if (offset < 4)
		return -EPROTO;
	if (offset < 6)
		return -EPROTONOSUPPORT;
	return -EBADMSG;
}

/* Any single corrupted byte of the 76 wire bytes is caught. */
static void test_flipped_bytes(void **state)
{
	static const uint8_t masks[] = { 0x01, 0x80, 0xff, 0x5a };
	struct rail_handle hs[2] = { make_v4(), make_v6() };

	(void)state;
	for (int k = 0; k < 2; k++) {
		uint8_t good[RAIL_HANDLE_SIZE];

		encode(&hs[k], good);
		for (int off = 0; off < RAIL_HANDLE_WIRE_SIZE; off++) {
			for (size_t m = 0; m < RAIL_ARRAY_SIZE(masks); m++) {
				uint8_t buf[RAIL_HANDLE_SIZE];
				struct rail_handle out;
				char why[256] = "";
				int err;

				memcpy(buf, good, sizeof(buf));
				buf[off] ^= masks[m];
				memset(&out, 0x77, sizeof(out));
				err = rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why));
				if (err != expected_flip_error(off))
					fail_msg("%s handle, byte %d ^ 0x%02x: decode returned %d, "
						 "expected %d (%s)", k ? "IPv6" : "IPv4", off,
						 masks[m], err, expected_flip_error(off), why);
				if (why[0] == '\0')
					fail_msg("byte %d: no reason given", off);
				if (err == -EBADMSG && !strstr(why, "corrupt"))
					fail_msg("byte %d: reason '%s' does not say corrupt", off, why);
			}
		}
	}
}

/* Bytes past the wire size, the stage slot among them, are not checked. */
static void test_stage_not_covered(void **state)
{
	struct rail_handle h = make_v6(), out;
	uint8_t buf[RAIL_HANDLE_SIZE], copy[RAIL_HANDLE_SIZE], saved[8];
	char why[128] = "";
	int anchor;

	(void)state;
	encode(&h, buf);
	assert_int_equal(rail_handle_set_stage(buf, &anchor), 0);
	assert_ptr_equal(rail_handle_get_stage(buf), &anchor);
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_same_handle(&h, &out);
	/* The slot holds no pointer: the stage's address appears nowhere in it. */
	{
		void *p = &anchor;

		assert_null(memmem(buf + RAIL_HANDLE_WIRE_SIZE, RAIL_HANDLE_SIZE -
				   RAIL_HANDLE_WIRE_SIZE, &p, sizeof(p)));
	}
	/* A copy of the buffer elsewhere does not see this buffer's stage. */
	memcpy(copy, buf, sizeof(copy));
	assert_null(rail_handle_get_stage(copy));
	memcpy(saved, buf + RAIL_HANDLE_STAGE_OFFSET, sizeof(saved));
	/* Bytes from the wire size on are free: decoding ignores them. */
	for (int i = RAIL_HANDLE_WIRE_SIZE; i < RAIL_HANDLE_SIZE; i++)
		buf[i] = 0xcd;
	assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
	assert_same_handle(&h, &out);
	assert_null(rail_handle_get_stage(buf));
	/* Put back, the slot names the stage again; released, it never does. */
	memcpy(buf + RAIL_HANDLE_STAGE_OFFSET, saved, sizeof(saved));
	assert_ptr_equal(rail_handle_get_stage(buf), &anchor);
	assert_int_equal(rail_handle_set_stage(buf, NULL), 0);
	assert_null(rail_handle_get_stage(buf));
	memcpy(buf + RAIL_HANDLE_STAGE_OFFSET, saved, sizeof(saved));
	assert_null(rail_handle_get_stage(buf));
	/* Re-encoding clears the slot. */
	assert_int_equal(rail_handle_set_stage(buf, &anchor), 0);
	assert_int_equal(rail_handle_encode(&h, buf, sizeof(buf)), 0);
	assert_null(rail_handle_get_stage(buf));
	/* Clearing a slot that names nothing live is harmless. */
	assert_int_equal(rail_handle_set_stage(buf, NULL), 0);
}

/* Random bytes anywhere in a handle never turn into a stage. */
static void test_stage_random_bytes(void **state)
{
	uint8_t bufs[200][RAIL_HANDLE_SIZE];
	int anchor[200];
	uint64_t x = 0x9e3779b97f4a7c15ull;

	(void)state;
	for (int i = 0; i < 200; i++) {
		memset(bufs[i], 0, RAIL_HANDLE_SIZE);
		assert_int_equal(rail_handle_set_stage(bufs[i], &anchor[i]), 0);
	}
	for (int i = 0; i < 200; i++)
		assert_ptr_equal(rail_handle_get_stage(bufs[i]), &anchor[i]);
	for (int k = 0; k < 100000; k++) {
		uint8_t r[RAIL_HANDLE_SIZE];

		for (int i = 0; i < RAIL_HANDLE_SIZE; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			r[i] = (uint8_t)x;
		}
		/* Small indexes and generations too, as a stale slot would hold. */
		if (k & 1) {
			r[RAIL_HANDLE_STAGE_OFFSET + 1] = r[RAIL_HANDLE_STAGE_OFFSET + 2] = 0;
			r[RAIL_HANDLE_STAGE_OFFSET + 3] = r[RAIL_HANDLE_STAGE_OFFSET + 6] = 0;
			r[RAIL_HANDLE_STAGE_OFFSET + 7] = 0;
		}
		assert_null(rail_handle_get_stage(r));
	}
	for (int i = 0; i < 200; i++)
		assert_int_equal(rail_handle_set_stage(bufs[i], NULL), 0);
}

static void test_bad_fields_behind_checksum(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t good[RAIL_HANDLE_SIZE], buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, good);

	memcpy(buf, good, sizeof(buf));
	buf[7] = 5; /* family */
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "family 5");

	memcpy(buf, good, sizeof(buf));
	buf[7] = 0;
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "family");

	memcpy(buf, good, sizeof(buf));
	rail_put_u16(buf + 18, RAIL_HANDLE_PAYLOAD_MAX + 1); /* payload too long */
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "payload 33");

	memcpy(buf, good, sizeof(buf));
	rail_put_u16(buf + 18, 0xffff);
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "payload");

	memcpy(buf, good, sizeof(buf));
	buf[6] = 4; /* transport: 3 is an RMA listener's (src/rma/) */
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "transport 4");

	memcpy(buf, good, sizeof(buf));
	buf[6] = 0;
	reseal(buf);
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "transport");

	/* The largest payload is fine. */
	memcpy(buf, good, sizeof(buf));
	rail_put_u16(buf + 18, RAIL_HANDLE_PAYLOAD_MAX);
	reseal(buf);
	{
		struct rail_handle out;
		char why[128] = "";

		assert_int_equal(rail_handle_decode(buf, sizeof(buf), &out, why, sizeof(why)), 0);
		assert_int_equal(out.payload_len, RAIL_HANDLE_PAYLOAD_MAX);
		assert_memory_equal(out.payload, "hello", 5);
	}
}

static void test_checksum_names_values(void **state)
{
	struct rail_handle h = make_v4();
	uint8_t buf[RAIL_HANDLE_SIZE];

	(void)state;
	encode(&h, buf);
	buf[30] ^= 1;
	expect_decode_error(buf, sizeof(buf), -EBADMSG, "checksum");
}

static void test_transport_name(void **state)
{
	(void)state;
	assert_string_equal(rail_transport_name(RAIL_TRANSPORT_TCP), "tcp");
	assert_string_equal(rail_transport_name(RAIL_TRANSPORT_IB), "ib");
	assert_string_equal(rail_transport_name(RAIL_TRANSPORT_RMA_TCP), "rma-tcp");
	assert_string_equal(rail_transport_name(0), "unknown");
	assert_string_equal(rail_transport_name(99), "unknown");
}

static void test_wire_helpers(void **state)
{
	uint8_t b[8];

	(void)state;
	rail_put_u16(b, 0x1234);
	assert_int_equal(b[0], 0x34);
	assert_int_equal(b[1], 0x12);
	assert_int_equal(rail_get_u16(b), 0x1234);
	rail_put_u16(b, 0xffff);
	assert_int_equal(rail_get_u16(b), 0xffff);
	rail_put_u32(b, 0xdeadbeefu);
	assert_memory_equal(b, "\xef\xbe\xad\xde", 4);
	assert_true(rail_get_u32(b) == 0xdeadbeefu);
	rail_put_u64(b, 0x8877665544332211ull);
	assert_memory_equal(b, "\x11\x22\x33\x44\x55\x66\x77\x88", 8);
	assert_true(rail_get_u64(b) == 0x8877665544332211ull);
	/* FNV-1a reference values: offset basis for "", and "a". */
	assert_true(rail_fnv1a((const uint8_t *)"", 0) == 0x811c9dc5u);
	assert_true(rail_fnv1a((const uint8_t *)"a", 1) == 0xe40c292cu);
	assert_true(rail_fnv1a((const uint8_t *)"foobar", 6) == 0xbf9cf968u);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_ipv4),
		cmocka_unit_test(test_roundtrip_ipv6_scope),
		cmocka_unit_test(test_roundtrip_empty_payload),
		cmocka_unit_test(test_wire_layout),
		cmocka_unit_test(test_encode_rejects),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_wrong_magic),
		cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_release),
		cmocka_unit_test(test_flipped_bytes),
		cmocka_unit_test(test_stage_not_covered),
		cmocka_unit_test(test_stage_random_bytes),
		cmocka_unit_test(test_bad_fields_behind_checksum),
		cmocka_unit_test(test_checksum_names_values),
		cmocka_unit_test(test_transport_name),
		cmocka_unit_test(test_wire_helpers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
