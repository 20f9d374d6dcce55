/*
 * libFuzzer target: every decoder of bytes a TCP peer sends (src/tcp/tcp_wire.c):
 * hello, reply, frame header, refusal. The input is cut into their sizes
 * (short inputs are zero-padded). A decoded value must survive
 * encode + decode unchanged.
 */
#include <stdint.h>
#include <string.h>

#include "tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Field by field: the structs have padding. */
static int hello_eq(const struct tcp_hello *a, const struct tcp_hello *b)
{
	return a->index == b->index && a->nonce == b->nonce && a->conn_id == b->conn_id &&
	       a->nsocks == b->nsocks && a->nthreads == b->nthreads &&
	       a->inline_max == b->inline_max && a->min_chunk == b->min_chunk;
}

static int refusal_eq(const struct tcp_refusal *a, const struct tcp_refusal *b)
{
	return a->reason == b->reason && a->tag == b->tag && a->want_tag == b->want_tag &&
	       a->seq == b->seq && a->size == b->size && a->posted == b->posted;
}

static void take(uint8_t *dst, size_t n, const uint8_t **data, size_t *size)
{
	size_t k = *size < n ? *size : n;

	memset(dst, 0, n);
	memcpy(dst, *data, k);
	*data += k;
	*size -= k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t hello[TCP_HELLO_SIZE], reply[TCP_REPLY_SIZE], frame[TCP_FRAME_SIZE];
	uint8_t refusal[TCP_REFUSAL_SIZE], again[TCP_HELLO_SIZE + TCP_REFUSAL_SIZE];
	struct tcp_hello h, h2;
	struct tcp_frame f, f2;
	struct tcp_refusal r, r2;
	char why[256];

	take(hello, sizeof(hello), &data, &size);
	take(reply, sizeof(reply), &data, &size);
	take(frame, sizeof(frame), &data, &size);
	take(refusal, sizeof(refusal), &data, &size);
	if (tcp_hello_decode(hello, &h, why, sizeof(why)) == 0) {
		tcp_hello_encode(&h, again);
		if (tcp_hello_decode(again, &h2, why, sizeof(why)) || !hello_eq(&h, &h2))
			__builtin_trap();
	}
	(void)tcp_reply_decode(reply);
	if (tcp_frame_decode(frame, &f) == 0) {
		tcp_frame_encode(&f, again);
		if (tcp_frame_decode(again, &f2) || f.seq != f2.seq || f.tag != f2.tag ||
		    f.size != f2.size)
			__builtin_trap();
	}
	if (tcp_refusal_decode(refusal, &r) == 0) {
		tcp_refusal_encode(&r, again);
		if (tcp_refusal_decode(again, &r2) || !refusal_eq(&r, &r2))
			__builtin_trap();
	}
	return 0;
}
