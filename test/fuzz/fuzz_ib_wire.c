/*
 * libFuzzer target: every decoder of bytes a verbs peer sends or writes
 * (src/ib/ib_wire.c): the handshake header and message, a clear-to-send
 * entry, the immediate, a completion record, the eager trailer, the want
 * and credit words, a handle's payload of GIDs. The first bytes pick the
 * expected sequence numbers. A decoded handshake message re-encodes to
 * bytes that decode and encode the same again.
 */
#include <stdint.h>
#include <string.h>

#include "ib/ib_wire.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t enc1[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX], enc2[sizeof(enc1)];
static struct rail_ib_msg m, m2;

static void fuzz_msg(const uint8_t *data, size_t size)
{
	char why[256];
	int type, n1, n2;

	if (size >= RAIL_IB_HDR_SIZE)
		(void)rail_ib_msg_header(data, &type, why, sizeof(why));
	if (rail_ib_msg_decode(data, size, &m, why, sizeof(why)))
		return;
	n1 = rail_ib_msg_encode(&m, enc1, sizeof(enc1));
	if (n1 < 0)
		return;
	if (rail_ib_msg_decode(enc1, (size_t)n1, &m2, why, sizeof(why)))
		__builtin_trap();
	n2 = rail_ib_msg_encode(&m2, enc2, sizeof(enc2));
	if (n2 != n1 || memcmp(enc1, enc2, (size_t)n1))
		__builtin_trap();
}

/* The fixed-size records, from a zero-padded copy of the input. */
static void fuzz_records(const uint8_t *data, size_t size)
{
	uint8_t b[RAIL_IB_CTS_SIZE + 4 * 64], gids[RAIL_IB_HANDLE_GIDS][16];
	uint32_t sizes[64], seq, consumed;
	struct rail_ib_cts c;
	struct rail_ib_eager_hdr e;
	struct rail_ib_want w;
	uint64_t value;
	uint16_t ack, flags;
	char why[256];
	int idx;

	memset(b, 0, sizeof(b));
	memcpy(b, data, size < sizeof(b) ? size : sizeof(b));
	seq = rail_ib_cts_seq(b);
	(void)rail_ib_cts_decode(b, seq, b[53], &c, why, sizeof(why));
	(void)rail_ib_cts_decode(b, seq + 1, 0, &c, why, sizeof(why));
	(void)rail_ib_imm_decode(rail_get_u32(b), &value, &idx);
	(void)rail_ib_sizes_decode(b, 1 + b[1] % 64, sizes);
	(void)rail_ib_eager_seq(b);
	(void)rail_ib_eager_decode(b, rail_ib_eager_seq(b), rail_get_u32(b + 8), &e, why,
				   sizeof(why));
	(void)rail_ib_want_decode(b, rail_get_u32(b + 12), &w);
	rail_ib_credit_decode(b, &consumed, &ack, &flags);
	(void)rail_ib_handle_gids_decode(b, b[2] % 64, gids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_msg(data, size);
	fuzz_records(data, size);
	return 0;
}
