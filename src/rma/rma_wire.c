/*
 * nccl-net-rail: the TCP RMA backend's wire formats (rma_tcp.h), encoded
 * and decoded here only. Decoders take nothing but the bytes, so that a
 * unit test or a fuzzer can feed them anything.
 *
 *   hello   0 magic "RMAH" u32 | 4 version u16 | 6 kind u16 | 8 nonce u64 |
 *           16 rank u32 | 20 nranks u32 | 24 seq u32 | 28 index u32 |
 *           32 FNV-1a of bytes 0..31 u32 | 36 zero
 *   frame   0 magic "RMAF" u32 | 4 op u8 | 5 zero[3] | 8 window u32 |
 *           12 status i32 | 16 offset u64 | 24 length or value u64 | 32 id u64
 *   record  0 magic "RMAR" u32 | 4 status i32 | 8 index u32 | 12 nranks u32 |
 *           16 base u64 | 24 size u64 | 32 FNV-1a of bytes 0..31 u32 | 36 zero
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "rail.h"
#include "rma/rma_tcp.h"
#include "wire.h"

const char *rma_op_name(int op)
{
	switch (op) {
	case RMA_OP_PUT: return "put";
	case RMA_OP_SIGNAL: return "signal";
	case RMA_OP_GET: return "get";
	case RMA_OP_REPLY: return "get reply";
	case RMA_OP_STRIPED: return "striped put";
	default: return "unknown";
	}
}

void rma_hello_encode(const struct rma_hello *h, uint8_t out[RMA_HELLO_SIZE])
{
	memset(out, 0, RMA_HELLO_SIZE);
	rail_put_u32(out, RMA_HELLO_MAGIC);
	rail_put_u16(out + 4, RMA_WIRE_VERSION);
	rail_put_u16(out + 6, h->kind);
	rail_put_u64(out + 8, h->nonce);
	rail_put_u32(out + 16, h->rank);
	rail_put_u32(out + 20, h->nranks);
	rail_put_u32(out + 24, h->seq);
	rail_put_u32(out + 28, h->index);
	rail_put_u32(out + 32, rail_fnv1a(out, 32));
}

int rma_hello_decode(const uint8_t in[RMA_HELLO_SIZE], struct rma_hello *h, char *why,
		     size_t why_len)
{
	struct rma_hello v;
	uint16_t version;

	if (rail_get_u32(in) != RMA_HELLO_MAGIC) {
		snprintf(why, why_len, "not an RMA hello (magic 0x%08x)", rail_get_u32(in));
		return -EPROTO;
	}
	version = rail_get_u16(in + 4);
	if (version != RMA_WIRE_VERSION) {
		snprintf(why, why_len, "RMA wire version %u, this build speaks %u (mixed releases?)",
			 version, RMA_WIRE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (rail_get_u32(in + 32) != rail_fnv1a(in, 32)) {
		snprintf(why, why_len, "RMA hello corrupt (checksum)");
		return -EBADMSG;
	}
	v.kind = rail_get_u16(in + 6);
	v.nonce = rail_get_u64(in + 8);
	v.rank = rail_get_u32(in + 16);
	v.nranks = rail_get_u32(in + 20);
	v.seq = rail_get_u32(in + 24);
	v.index = rail_get_u32(in + 28);
	if ((v.kind != RMA_LINK_CTRL && v.kind != RMA_LINK_DATA) || v.nranks == 0 ||
	    v.nranks > RAIL_RMA_MAX_RANKS || v.rank >= v.nranks ||
	    v.index >= RAIL_RMA_MAX_CONTEXTS) {
		snprintf(why, why_len, "RMA hello with kind %u, rank %u of %u, context %u: out of "
			 "range", v.kind, v.rank, v.nranks, v.index);
		return -EBADMSG;
	}
	*h = v;
	return 0;
}

void rma_frame_encode(const struct rma_frame *f, uint8_t out[RMA_FRAME_SIZE])
{
	memset(out, 0, RMA_FRAME_SIZE);
	rail_put_u32(out, RMA_FRAME_MAGIC);
	out[4] = f->op;
	rail_put_u32(out + 8, f->win);
	rail_put_u32(out + 12, (uint32_t)f->status);
	rail_put_u64(out + 16, f->off);
	rail_put_u64(out + 24, f->len);
	rail_put_u64(out + 32, f->id);
}

int rma_frame_decode(const uint8_t in[RMA_FRAME_SIZE], struct rma_frame *f, char *why,
		     size_t why_len)
{
	struct rma_frame v;

	if (rail_get_u32(in) != RMA_FRAME_MAGIC || in[5] || in[6] || in[7]) {
		snprintf(why, why_len, "not an RMA frame (magic 0x%08x): the stream is out of step",
			 rail_get_u32(in));
		return -EPROTO;
	}
	v.op = in[4];
	v.win = rail_get_u32(in + 8);
	v.status = (int32_t)rail_get_u32(in + 12);
	v.off = rail_get_u64(in + 16);
	v.len = rail_get_u64(in + 24);
	v.id = rail_get_u64(in + 32);
	if (v.op < RMA_OP_PUT || v.op > RMA_OP_STRIPED) {
		snprintf(why, why_len, "unknown RMA operation %u", v.op);
		return -EBADMSG;
	}
	if ((v.op != RMA_OP_REPLY && v.status) || (v.op == RMA_OP_REPLY && v.status < 0) ||
	    (v.op != RMA_OP_SIGNAL && v.len > RMA_MAX_LEN)) {
		snprintf(why, why_len, "RMA %s with status %d and length %llu: out of range",
			 rma_op_name(v.op), v.status, (unsigned long long)v.len);
		return -EBADMSG;
	}
	*f = v;
	return 0;
}

void rma_record_encode(const struct rma_record *r, uint8_t out[RMA_RECORD_SIZE])
{
	memset(out, 0, RMA_RECORD_SIZE);
	rail_put_u32(out, RMA_RECORD_MAGIC);
	rail_put_u32(out + 4, (uint32_t)r->status);
	rail_put_u32(out + 8, r->index);
	rail_put_u32(out + 12, r->nranks);
	rail_put_u64(out + 16, r->base);
	rail_put_u64(out + 24, r->size);
	rail_put_u32(out + 32, rail_fnv1a(out, 32));
}

int rma_record_decode(const uint8_t in[RMA_RECORD_SIZE], struct rma_record *r)
{
	if (rail_get_u32(in) != RMA_RECORD_MAGIC || rail_get_u32(in + 32) != rail_fnv1a(in, 32))
		return -EPROTO;
	r->status = (int32_t)rail_get_u32(in + 4);
	r->index = rail_get_u32(in + 8);
	r->nranks = rail_get_u32(in + 12);
	r->base = rail_get_u64(in + 16);
	r->size = rail_get_u64(in + 24);
	if (r->status < 0 || r->status > 4095)
		return -EPROTO;
	return 0;
}
