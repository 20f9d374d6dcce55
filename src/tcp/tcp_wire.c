/*
 * nccl-net-rail: everything the TCP transport reads from a peer is decoded
 * here (hello, reply, frame header), by functions with no other inputs, so
 * they can be unit-tested and fuzzed on their own.
 */
#include <stdio.h>
#include <string.h>

#include "rail.h"
#include "tcp/tcp.h"
#include "wire.h"

/*
 * hello: magic u32 | version u16 | index u16 | nonce u64 | conn_id u64 |
 *        nsocks u16 | nthreads u16 | inline_max u32 | min_chunk u32 | fnv u32
 */
void tcp_hello_encode(const struct tcp_hello *h, uint8_t out[TCP_HELLO_SIZE])
{
	rail_put_u32(out, TCP_HELLO_MAGIC);
	rail_put_u16(out + 4, TCP_WIRE_VERSION);
	rail_put_u16(out + 6, h->index);
	rail_put_u64(out + 8, h->nonce);
	rail_put_u64(out + 16, h->conn_id);
	rail_put_u16(out + 24, h->nsocks);
	rail_put_u16(out + 26, h->nthreads);
	rail_put_u32(out + 28, h->inline_max);
	rail_put_u32(out + 32, h->min_chunk);
	rail_put_u32(out + 36, rail_fnv1a(out, 36));
}

int tcp_hello_decode(const uint8_t in[TCP_HELLO_SIZE], struct tcp_hello *h, char *why,
		     size_t why_len)
{
	struct tcp_hello v;

	if (rail_get_u32(in) != TCP_HELLO_MAGIC) {
		snprintf(why, why_len, "not a nccl-net-rail TCP connection (magic 0x%08x)",
			 rail_get_u32(in));
		return -EPROTO;
	}
	if (rail_get_u16(in + 4) != TCP_WIRE_VERSION) {
		snprintf(why, why_len, "peer speaks TCP wire version %u, we speak %d: use the "
			 "same nccl-net-rail build on every node", rail_get_u16(in + 4),
			 TCP_WIRE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (rail_get_u32(in + 36) != rail_fnv1a(in, 36)) {
		snprintf(why, why_len, "corrupt hello (bad checksum)");
		return -EBADMSG;
	}
	v.index = rail_get_u16(in + 6);
	v.nonce = rail_get_u64(in + 8);
	v.conn_id = rail_get_u64(in + 16);
	v.nsocks = rail_get_u16(in + 24);
	v.nthreads = rail_get_u16(in + 26);
	v.inline_max = rail_get_u32(in + 28);
	v.min_chunk = rail_get_u32(in + 32);
	if (v.nsocks < 1 || v.nsocks > TCP_MAX_SOCKS || v.nthreads < 1 ||
	    v.nthreads > TCP_MAX_THREADS || v.nthreads > v.nsocks || v.index > v.nsocks ||
	    v.min_chunk == 0) {
		snprintf(why, why_len, "corrupt hello (socket %u of %u, %u threads, chunk %u)",
			 v.index, v.nsocks, v.nthreads, v.min_chunk);
		return -EBADMSG;
	}
	*h = v;
	return 0;
}

void tcp_reply_encode(int status, uint8_t out[TCP_REPLY_SIZE])
{
	rail_put_u32(out, TCP_REPLY_MAGIC);
	rail_put_u32(out + 4, (uint32_t)status);
}

int tcp_reply_decode(const uint8_t in[TCP_REPLY_SIZE])
{
	uint32_t status = rail_get_u32(in + 4);

	if (rail_get_u32(in) != TCP_REPLY_MAGIC || status > 4095)
		return -EPROTO;
	return (int)status;
}

/* frame: magic u8 | 0 u8 | 0 u16 | tag i32 | seq u64 | size u64 */
void tcp_frame_encode(const struct tcp_frame *f, uint8_t out[TCP_FRAME_SIZE])
{
	out[0] = TCP_FRAME_MAGIC;
	out[1] = 0;
	rail_put_u16(out + 2, 0);
	rail_put_u32(out + 4, (uint32_t)f->tag);
	rail_put_u64(out + 8, f->seq);
	rail_put_u64(out + 16, f->size);
}

int tcp_frame_decode(const uint8_t in[TCP_FRAME_SIZE], struct tcp_frame *f)
{
	if (in[0] != TCP_FRAME_MAGIC || in[1] != 0 || rail_get_u16(in + 2) != 0)
		return -EPROTO;
	f->tag = (int32_t)rail_get_u32(in + 4);
	f->seq = rail_get_u64(in + 8);
	f->size = rail_get_u64(in + 16);
	if (f->size > RAIL_MAX_MSG_BYTES * 1024)
		return -EPROTO;
	return 0;
}

/*
 * refusal: magic u8 | reason u8 | 0 u16 | tag i32 | want_tag i32 | 0 u32 |
 *          seq u64 | size u64 | posted u64
 */
void tcp_refusal_encode(const struct tcp_refusal *r, uint8_t out[TCP_REFUSAL_SIZE])
{
	out[0] = TCP_REFUSAL_MAGIC;
	out[1] = (uint8_t)r->reason;
	rail_put_u16(out + 2, 0);
	rail_put_u32(out + 4, (uint32_t)r->tag);
	rail_put_u32(out + 8, (uint32_t)r->want_tag);
	rail_put_u32(out + 12, 0);
	rail_put_u64(out + 16, r->seq);
	rail_put_u64(out + 24, r->size);
	rail_put_u64(out + 32, r->posted);
}

int tcp_refusal_decode(const uint8_t in[TCP_REFUSAL_SIZE], struct tcp_refusal *r)
{
	struct tcp_refusal v;

	if (in[0] != TCP_REFUSAL_MAGIC || rail_get_u16(in + 2) != 0 || rail_get_u32(in + 12) != 0)
		return -EPROTO;
	v.reason = in[1];
	v.tag = (int32_t)rail_get_u32(in + 4);
	v.want_tag = (int32_t)rail_get_u32(in + 8);
	v.seq = rail_get_u64(in + 16);
	v.size = rail_get_u64(in + 24);
	v.posted = rail_get_u64(in + 32);
	if (v.size > RAIL_MAX_MSG_BYTES * 1024)
		return -EPROTO;
	if (v.reason == TCP_REFUSE_SIZE ? v.posted >= v.size
					: v.reason != TCP_REFUSE_TAG || v.posted != 0)
		return -EPROTO;
	*r = v;
	return 0;
}

void tcp_plan_message(size_t size, uint64_t seq, int nsocks, size_t min_chunk,
		      struct tcp_plan *plan)
{
	size_t chunk = RAIL_DIV_UP(size, (size_t)nsocks);

	if (chunk < min_chunk)
		chunk = min_chunk;
	chunk = RAIL_ALIGN_UP(chunk, 4096);
	plan->chunk = chunk;
	plan->nchunks = size ? (int)RAIL_DIV_UP(size, chunk) : 0;
	plan->first = (int)(seq % (uint64_t)nsocks);
}
