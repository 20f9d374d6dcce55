/*
 * libFuzzer target: every decoder of bytes a TCP peer sends (src/tcp/tcp_wire.c):
 * hello, reply, frame header, refusal, and for failover the rescue block, a
 * move hello, a challenge, a proof and the receiver's state (its socket
 * count from one byte). The input is cut into their sizes (short inputs are
 * zero-padded). A decoded value must survive encode + decode unchanged.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "tcp/tcp.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Field by field: the structs have padding. */
static int hello_eq(const struct tcp_hello *a, const struct tcp_hello *b)
{
	return a->index == b->index && a->nonce == b->nonce && a->conn_id == b->conn_id &&
	       a->nsocks == b->nsocks && a->nthreads == b->nthreads && a->flags == b->flags &&
	       a->inline_max == b->inline_max && a->min_chunk == b->min_chunk;
}

static int refusal_eq(const struct tcp_refusal *a, const struct tcp_refusal *b)
{
	return a->reason == b->reason && a->tag == b->tag && a->want_tag == b->want_tag &&
	       a->seq == b->seq && a->size == b->size && a->posted == b->posted;
}

static int rescue_eq(const struct tcp_rescue *a, const struct tcp_rescue *b)
{
	if (a->count != b->count || memcmp(a->share, b->share, sizeof(a->share)))
		return 0;
	for (int i = 0; i < a->count; i++)
		if (rail_sockaddr_port(&a->addr[i]) != rail_sockaddr_port(&b->addr[i]) ||
		    !tcp_same_ip(&a->addr[i], &b->addr[i]))
			return 0;
	return 1;
}

static int move_hello_eq(const struct tcp_move_hello *a, const struct tcp_move_hello *b)
{
	return a->kind == b->kind && a->index == b->index && a->nsocks == b->nsocks &&
	       a->gen == b->gen && a->up_s == b->up_s && a->nonce == b->nonce &&
	       a->conn_id == b->conn_id && !memcmp(a->rand, b->rand, sizeof(a->rand));
}

static void take(uint8_t *dst, size_t n, const uint8_t **data, size_t *size)
{
	size_t k = *size < n ? *size : n;

	memset(dst, 0, n);
	memcpy(dst, *data, k);
	*data += k;
	*size -= k;
}

/* The failover messages, from what is left of the input. */
static void failover_decoders(const uint8_t *data, size_t size)
{
	uint8_t rescue[TCP_RESCUE_SIZE], mh[TCP_MOVE_HELLO_SIZE], chal[TCP_MOVE_CHALLENGE_SIZE];
	uint8_t proof[TCP_MOVE_PROOF_SIZE], n8, state[TCP_STATE_SIZE(TCP_MAX_SOCKS)];
	uint8_t again[TCP_STATE_SIZE(TCP_MAX_SOCKS)], rnd[TCP_MOVE_RAND_SIZE], mac[TCP_MAC_SIZE];
	uint64_t pos[TCP_MAX_SOCKS + 1], pos2[TCP_MAX_SOCKS + 1];
	struct tcp_rescue r, r2;
	struct tcp_move_hello h, h2;
	int nsocks, err;

	take(rescue, sizeof(rescue), &data, &size);
	take(mh, sizeof(mh), &data, &size);
	take(chal, sizeof(chal), &data, &size);
	take(proof, sizeof(proof), &data, &size);
	take(&n8, 1, &data, &size);
	nsocks = 1 + n8 % TCP_MAX_SOCKS;
	take(state, TCP_STATE_SIZE(nsocks), &data, &size);
	if (tcp_rescue_decode(rescue, &r) == 0) {
		tcp_rescue_encode(&r, again);
		if (tcp_rescue_decode(again, &r2) || !rescue_eq(&r, &r2))
			__builtin_trap();
	}
	if (tcp_move_hello_decode(mh, &h) == 0) {
		tcp_move_hello_encode(&h, again);
		if (tcp_move_hello_decode(again, &h2) || !move_hello_eq(&h, &h2))
			__builtin_trap();
	}
	if (tcp_move_challenge_decode(chal, rnd, mac) == 0) {
		tcp_move_challenge_encode(rnd, mac, again);
		if (memcmp(again, chal, sizeof(chal)))
			__builtin_trap();
	}
	if (tcp_move_proof_decode(proof, mac) == 0) {
		tcp_move_proof_encode(mac, again);
		if (memcmp(again, proof, sizeof(proof)))
			__builtin_trap();
	}
	err = tcp_state_decode(state, rail_get_u32(state + 4), nsocks, pos);
	if (err == 0 || err == -EBUSY) {
		tcp_state_encode(rail_get_u32(state + 4), err == -EBUSY, nsocks, pos, again);
		if (tcp_state_decode(again, rail_get_u32(state + 4), nsocks, pos2) != err ||
		    memcmp(pos, pos2, sizeof(uint64_t) * ((size_t)nsocks + 1)))
			__builtin_trap();
	}
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
		    f.size != f2.size || f.flags != f2.flags)
			__builtin_trap();
	}
	if (tcp_refusal_decode(refusal, &r) == 0) {
		tcp_refusal_encode(&r, again);
		if (tcp_refusal_decode(again, &r2) || !refusal_eq(&r, &r2))
			__builtin_trap();
	}
	failover_decoders(data, size);
	return 0;
}
