/*
 * libFuzzer target: every decoder of bytes another rank sends the TCP RMA
 * backend (src/rma/rma_wire.c): the hello, the frame header and the
 * exchange record, cut from the input in that order (short inputs are
 * zero-padded), then 8 bytes of a window size. A decoded value must survive
 * encode + decode unchanged, and the target's range check must never pass
 * a range that does not fit the window.
 */
#include <stdint.h>
#include <string.h>

#include "rma/rma_tcp.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void take(uint8_t *dst, size_t n, const uint8_t **data, size_t *size)
{
	size_t k = *size < n ? *size : n;

	memset(dst, 0, n);
	memcpy(dst, *data, k);
	*data += k;
	*size -= k;
}

static void hello_round_trip(const uint8_t *b)
{
	struct rma_hello h, h2;
	uint8_t again[RMA_HELLO_SIZE];
	char why[256];

	if (rma_hello_decode(b, &h, why, sizeof(why)))
		return;
	rma_hello_encode(&h, again);
	if (rma_hello_decode(again, &h2, why, sizeof(why)) || h.kind != h2.kind ||
	    h.nonce != h2.nonce || h.rank != h2.rank || h.nranks != h2.nranks ||
	    h.seq != h2.seq || h.index != h2.index || h.rank >= h.nranks)
		__builtin_trap();
}

static void frame_round_trip(const uint8_t *b, uint64_t wsize)
{
	struct rma_frame f, f2;
	uint8_t again[RMA_FRAME_SIZE];
	char why[256];

	if (rma_frame_decode(b, &f, why, sizeof(why)))
		return;
	rma_frame_encode(&f, again);
	if (rma_frame_decode(again, &f2, why, sizeof(why)) || f.op != f2.op || f.win != f2.win ||
	    f.status != f2.status || f.off != f2.off || f.len != f2.len || f.id != f2.id)
		__builtin_trap();
	if (rma_in_bounds(f.off, f.len, wsize) &&
	    (unsigned __int128)f.off + f.len > (unsigned __int128)wsize)
		__builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t hello[RMA_HELLO_SIZE], frame[RMA_FRAME_SIZE], rec[RMA_RECORD_SIZE], ws[8];
	uint8_t again[RMA_RECORD_SIZE];
	struct rma_record r, r2;

	take(hello, sizeof(hello), &data, &size);
	take(frame, sizeof(frame), &data, &size);
	take(rec, sizeof(rec), &data, &size);
	take(ws, sizeof(ws), &data, &size);
	hello_round_trip(hello);
	frame_round_trip(frame, rail_get_u64(ws));
	if (rma_record_decode(rec, &r) == 0) {
		rma_record_encode(&r, again);
		if (rma_record_decode(again, &r2) || r.status != r2.status || r.index != r2.index ||
		    r.nranks != r2.nranks || r.base != r2.base || r.size != r2.size)
			__builtin_trap();
	}
	return 0;
}
