/*
 * nccl-net-rail: everything the TCP transport reads from a peer is decoded
 * here (hello, reply, frame header), by functions with no other inputs, so
 * they can be unit-tested and fuzzed on their own.
 */
#include <stdio.h>
#include <string.h>

#include "rail.h"
#include "sha256.h"
#include "tcp/tcp.h"
#include "wire.h"

/*
 * hello: magic u32 | version u16 | index u16 | nonce u64 | conn_id u64 |
 *        nsocks u16 | nthreads u8 | flags u8 | inline_max u32 | min_chunk u32 | fnv u32
 */
void tcp_hello_encode(const struct tcp_hello *h, uint8_t out[TCP_HELLO_SIZE])
{
	rail_put_u32(out, TCP_HELLO_MAGIC);
	rail_put_u16(out + 4, TCP_WIRE_VERSION);
	rail_put_u16(out + 6, h->index);
	rail_put_u64(out + 8, h->nonce);
	rail_put_u64(out + 16, h->conn_id);
	rail_put_u16(out + 24, h->nsocks);
	out[26] = h->nthreads;
	out[27] = h->flags;
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
	v.nthreads = in[26];
	v.flags = in[27];
	v.inline_max = rail_get_u32(in + 28);
	v.min_chunk = rail_get_u32(in + 32);
	if (v.nsocks < 1 || v.nsocks > TCP_MAX_SOCKS || v.nthreads < 1 ||
	    v.nthreads > TCP_MAX_THREADS || v.nthreads > v.nsocks || v.index > v.nsocks ||
	    v.min_chunk == 0 || (v.flags & ~TCP_HELLO_LAZY) || ((v.flags & TCP_HELLO_LAZY) && v.index)) {
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

/* frame: magic u8 | flags u8 | 0 u16 | tag i32 | seq u64 | size u64 */
void tcp_frame_encode(const struct tcp_frame *f, uint8_t out[TCP_FRAME_SIZE])
{
	out[0] = TCP_FRAME_MAGIC;
	out[1] = f->flags;
	rail_put_u16(out + 2, 0);
	rail_put_u32(out + 4, (uint32_t)f->tag);
	rail_put_u64(out + 8, f->seq);
	rail_put_u64(out + 16, f->size);
}

int tcp_frame_decode(const uint8_t in[TCP_FRAME_SIZE], struct tcp_frame *f)
{
	if (in[0] != TCP_FRAME_MAGIC || (in[1] & ~TCP_FRAME_INLINE) || rail_get_u16(in + 2) != 0)
		return -EPROTO;
	f->flags = in[1];
	f->tag = (int32_t)rail_get_u32(in + 4);
	f->seq = rail_get_u64(in + 8);
	f->size = rail_get_u64(in + 16);
	if (f->size > RAIL_MAX_MSG_BYTES * 1024 ||
	    ((f->flags & TCP_FRAME_INLINE) && f->size > TCP_DIRECT_MAX))
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

/*
 * rescue: count u16 | 0 u16 | 4 x (family u16 | port u16 | addr 16) | share 32 |
 *         fnv u32
 */
void tcp_rescue_encode(const struct tcp_rescue *r, uint8_t out[TCP_RESCUE_SIZE])
{
	memset(out, 0, TCP_RESCUE_SIZE);
	rail_put_u16(out, (uint16_t)r->count);
	for (int i = 0; i < r->count && i < TCP_RESCUE_MAX; i++) {
		uint8_t *e = out + 4 + 20 * i;
		const union rail_sockaddr *a = &r->addr[i];

		if (a->sa.sa_family == AF_INET6) {
			rail_put_u16(e, 6);
			memcpy(e + 4, &a->sin6.sin6_addr, 16);
		} else {
			rail_put_u16(e, 4);
			memcpy(e + 4, &a->sin.sin_addr, 4);
		}
		rail_put_u16(e + 2, (uint16_t)rail_sockaddr_port(a));
	}
	memcpy(out + 84, r->share, TCP_SHARE_SIZE);
	rail_put_u32(out + 116, rail_fnv1a(out, 116));
}

int tcp_rescue_decode(const uint8_t in[TCP_RESCUE_SIZE], struct tcp_rescue *r)
{
	struct tcp_rescue v;

	memset(&v, 0, sizeof(v));
	v.count = rail_get_u16(in);
	if (rail_get_u32(in + 116) != rail_fnv1a(in, 116) || rail_get_u16(in + 2) ||
	    v.count > TCP_RESCUE_MAX)
		return -EPROTO;
	for (int i = 0; i < v.count; i++) {
		const uint8_t *e = in + 4 + 20 * i;
		union rail_sockaddr *a = &v.addr[i];
		uint16_t fam = rail_get_u16(e);

		if (fam == 6) {
			a->sin6.sin6_family = AF_INET6;
			memcpy(&a->sin6.sin6_addr, e + 4, 16);
		} else if (fam == 4) {
			a->sin.sin_family = AF_INET;
			memcpy(&a->sin.sin_addr, e + 4, 4);
		} else {
			return -EPROTO;
		}
		if (!rail_get_u16(e + 2))
			return -EPROTO;
		rail_sockaddr_set_port(a, rail_get_u16(e + 2));
	}
	memcpy(v.share, in + 84, TCP_SHARE_SIZE);
	*r = v;
	return 0;
}

void tcp_move_key(const uint8_t conn_share[TCP_SHARE_SIZE],
		  const uint8_t listen_share[TCP_SHARE_SIZE], uint64_t conn_id, uint64_t nonce,
		  uint8_t key[TCP_KEY_SIZE])
{
	static const char label[] = "nccl-net-rail tcp move key";
	uint8_t shares[2 * TCP_SHARE_SIZE], ids[16];
	struct rail_hmac m;

	memcpy(shares, conn_share, TCP_SHARE_SIZE);
	memcpy(shares + TCP_SHARE_SIZE, listen_share, TCP_SHARE_SIZE);
	rail_put_u64(ids, conn_id);
	rail_put_u64(ids + 8, nonce);
	rail_hmac_init(&m, shares, sizeof(shares));
	rail_hmac_update(&m, label, sizeof(label));
	rail_hmac_update(&m, ids, sizeof(ids));
	rail_hmac_final(&m, key);
	memset(shares, 0, sizeof(shares));
}

/*
 * move hello: magic u32 | version u16 | kind u16 | index u16 | nsocks u16 | gen u32 |
 *             nonce u64 | conn_id u64 | up_s u32 (BACK; else 0) | rand 16 | fnv u32
 */
void tcp_move_hello_encode(const struct tcp_move_hello *h, uint8_t out[TCP_MOVE_HELLO_SIZE])
{
	memset(out, 0, TCP_MOVE_HELLO_SIZE);
	rail_put_u32(out, TCP_MOVE_MAGIC);
	rail_put_u16(out + 4, TCP_WIRE_VERSION);
	rail_put_u16(out + 6, (uint16_t)h->kind);
	rail_put_u16(out + 8, h->index);
	rail_put_u16(out + 10, h->nsocks);
	rail_put_u32(out + 12, h->gen);
	rail_put_u64(out + 16, h->nonce);
	rail_put_u64(out + 24, h->conn_id);
	rail_put_u32(out + 32, h->kind == TCP_MOVE_BACK ? h->up_s : 0);
	memcpy(out + 36, h->rand, TCP_MOVE_RAND_SIZE);
	rail_put_u32(out + 52, rail_fnv1a(out, 52));
}

int tcp_move_hello_decode(const uint8_t in[TCP_MOVE_HELLO_SIZE], struct tcp_move_hello *h)
{
	struct tcp_move_hello v;

	if (rail_get_u32(in) != TCP_MOVE_MAGIC || rail_get_u16(in + 4) != TCP_WIRE_VERSION ||
	    rail_get_u32(in + 52) != rail_fnv1a(in, 52))
		return -EPROTO;
	v.kind = rail_get_u16(in + 6);
	v.index = rail_get_u16(in + 8);
	v.nsocks = rail_get_u16(in + 10);
	v.gen = rail_get_u32(in + 12);
	v.nonce = rail_get_u64(in + 16);
	v.conn_id = rail_get_u64(in + 24);
	v.up_s = rail_get_u32(in + 32);
	memcpy(v.rand, in + 36, TCP_MOVE_RAND_SIZE);
	/* nsocks 0: a lazy comm without data sockets yet moves its control socket alone */
	if ((v.kind != TCP_MOVE_SOCKET && v.kind != TCP_MOVE_KICK && v.kind != TCP_MOVE_BACK &&
	     v.kind != TCP_MOVE_OPEN) ||
	    (v.kind != TCP_MOVE_BACK && v.up_s) || v.nsocks > TCP_MAX_SOCKS ||
	    v.index > v.nsocks || (v.kind == TCP_MOVE_KICK && v.index) ||
	    (v.kind == TCP_MOVE_OPEN && !v.index))
		return -EPROTO;
	*h = v;
	return 0;
}

/*
 * MAC of the move handshake: HMAC-SHA256(key, label | role u8 | hello | challenge rand).
 * The role keeps a listener's MAC from ever passing for a mover's proof.
 */
void tcp_move_mac(const uint8_t key[TCP_KEY_SIZE], enum tcp_move_role role,
		  const uint8_t hello[TCP_MOVE_HELLO_SIZE],
		  const uint8_t challenge[TCP_MOVE_RAND_SIZE], uint8_t mac[TCP_MAC_SIZE])
{
	static const char label[] = "nccl-net-rail tcp move";
	uint8_t r = (uint8_t)role;
	struct rail_hmac m;

	rail_hmac_init(&m, key, TCP_KEY_SIZE);
	rail_hmac_update(&m, label, sizeof(label));
	rail_hmac_update(&m, &r, 1);
	rail_hmac_update(&m, hello, TCP_MOVE_HELLO_SIZE);
	rail_hmac_update(&m, challenge, TCP_MOVE_RAND_SIZE);
	rail_hmac_final(&m, mac);
}

/* challenge: magic u32 | 0 u32 | rand 16 | mac 32 */
void tcp_move_challenge_encode(const uint8_t rand[TCP_MOVE_RAND_SIZE],
			       const uint8_t mac[TCP_MAC_SIZE],
			       uint8_t out[TCP_MOVE_CHALLENGE_SIZE])
{
	rail_put_u32(out, TCP_MOVE_CHALLENGE_MAGIC);
	rail_put_u32(out + 4, 0);
	memcpy(out + 8, rand, TCP_MOVE_RAND_SIZE);
	memcpy(out + 8 + TCP_MOVE_RAND_SIZE, mac, TCP_MAC_SIZE);
}

int tcp_move_challenge_decode(const uint8_t in[TCP_MOVE_CHALLENGE_SIZE],
			      uint8_t rand[TCP_MOVE_RAND_SIZE], uint8_t mac[TCP_MAC_SIZE])
{
	if (rail_get_u32(in) != TCP_MOVE_CHALLENGE_MAGIC || rail_get_u32(in + 4))
		return -EPROTO;
	memcpy(rand, in + 8, TCP_MOVE_RAND_SIZE);
	memcpy(mac, in + 8 + TCP_MOVE_RAND_SIZE, TCP_MAC_SIZE);
	return 0;
}

/* proof: magic u32 | 0 u32 | mac 32 */
void tcp_move_proof_encode(const uint8_t mac[TCP_MAC_SIZE], uint8_t out[TCP_MOVE_PROOF_SIZE])
{
	rail_put_u32(out, TCP_MOVE_PROOF_MAGIC);
	rail_put_u32(out + 4, 0);
	memcpy(out + 8, mac, TCP_MAC_SIZE);
}

int tcp_move_proof_decode(const uint8_t in[TCP_MOVE_PROOF_SIZE], uint8_t mac[TCP_MAC_SIZE])
{
	if (rail_get_u32(in) != TCP_MOVE_PROOF_MAGIC || rail_get_u32(in + 4))
		return -EPROTO;
	memcpy(mac, in + 8, TCP_MAC_SIZE);
	return 0;
}

/* state: magic u32 (RTCS, or RTCB: declined, pos[0] says why) | gen u32 | nsocks u32 |
 *        fnv u32 (of the positions) | pos u64 x nsocks+1 */
int tcp_state_encode(uint32_t gen, int busy, int nsocks, const uint64_t *pos, uint8_t *out)
{
	for (int i = 0; i <= nsocks; i++)
		rail_put_u64(out + 16 + 8 * i, pos[i]);
	rail_put_u32(out, busy ? TCP_STATE_BUSY_MAGIC : TCP_STATE_MAGIC);
	rail_put_u32(out + 4, gen);
	rail_put_u32(out + 8, (uint32_t)nsocks);
	rail_put_u32(out + 12, rail_fnv1a(out + 16, 8 * ((size_t)nsocks + 1)));
	return (int)TCP_STATE_SIZE(nsocks);
}

int tcp_state_decode(const uint8_t *in, uint32_t gen, int nsocks, uint64_t *pos)
{
	uint32_t magic = rail_get_u32(in);

	if ((magic != TCP_STATE_MAGIC && magic != TCP_STATE_BUSY_MAGIC) ||
	    rail_get_u32(in + 4) != gen || rail_get_u32(in + 8) != (uint32_t)nsocks ||
	    rail_get_u32(in + 12) != rail_fnv1a(in + 16, 8 * ((size_t)nsocks + 1)))
		return -EPROTO;
	for (int i = 0; i <= nsocks; i++)
		pos[i] = rail_get_u64(in + 16 + 8 * i);
	return magic == TCP_STATE_BUSY_MAGIC ? -EBUSY : 0;
}
