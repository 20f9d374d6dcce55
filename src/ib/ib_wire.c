/* nccl-net-rail: the verbs transport's wire formats (layouts in ib_wire.h). */
#include <endian.h>
#include <stdio.h>
#include <string.h>

#include "ib/ib_wire.h"
#include "rail.h"
#include "wire.h"

#define DEV_SIZE 28
#define FIXED_SIZE 52
#define ECE_SIZE 12
#define MOVE_FIXED 28	/* epoch, role, reason, nans, seq, e_seen, e_head, flags */

static int has_move(int type)
{
	return type == RAIL_IB_MSG_MOVE;
}

static size_t move_size(const struct rail_ib_msg *m)
{
	return has_move(m->type) ? MOVE_FIXED + (size_t)m->move.nans * 8 : 0;
}

static uint8_t *move_put(const struct rail_ib_move_state *s, uint8_t *p)
{
	rail_put_u32(p, s->epoch);
	p[4] = s->role;
	p[5] = s->reason;
	rail_put_u16(p + 6, (uint16_t)s->nans);
	rail_put_u64(p + 8, s->seq);
	rail_put_u32(p + 16, s->e_seen);
	rail_put_u32(p + 20, s->e_head);
	rail_put_u32(p + 24, s->flags);
	p += MOVE_FIXED;
	for (int i = 0; i < s->nans; i++, p += 8)
		rail_put_u64(p, s->ans[i]);
	return p;
}

/* The move block at p, of left bytes: the rest of the body. */
static int move_get(const uint8_t *p, size_t left, struct rail_ib_move_state *s, char *why,
		    size_t why_len)
{
	if (left < MOVE_FIXED)
		goto bad;
	s->epoch = rail_get_u32(p);
	s->role = p[4];
	s->reason = p[5];
	s->nans = rail_get_u16(p + 6);
	s->seq = rail_get_u64(p + 8);
	s->e_seen = rail_get_u32(p + 16);
	s->e_head = rail_get_u32(p + 20);
	s->flags = p[24];
	if (s->role > 1 || rail_get_u32(p + 24) > 0xff || s->nans > RAIL_IB_WIRE_MAX_QPS ||
	    left != MOVE_FIXED + (size_t)s->nans * 8)
		goto bad;
	p += MOVE_FIXED;
	for (int i = 0; i < s->nans; i++, p += 8)
		s->ans[i] = rail_get_u64(p);
	return 0;
bad:
	snprintf(why, why_len, "move message corrupt (%zu bytes of state)", left);
	return -EBADMSG;
}

int rail_ib_msg_encode(const struct rail_ib_msg *m, uint8_t *buf, size_t len)
{
	size_t text_len = strnlen(m->text, RAIL_IB_REFUSE_TEXT);
	size_t body = FIXED_SIZE + (size_t)m->ndevs * DEV_SIZE + (size_t)m->nqps * 4 + 1 + text_len +
		      1 + (size_t)m->nece * ECE_SIZE + move_size(m);
	uint8_t *p = buf + RAIL_IB_HDR_SIZE;

	if (m->ndevs < 0 || m->ndevs > RAIL_MAX_VDEV_DEVS || m->nqps < 0 || m->eager_slots < 0 ||
	    (m->nece && m->nece != m->ndevs) ||
	    (has_move(m->type) && (m->move.nans < 0 || m->move.nans > RAIL_IB_WIRE_MAX_QPS)) ||
	    m->eager_slots > RAIL_IB_EAGER_MAX_SLOTS ||
	    m->nqps > RAIL_IB_WIRE_MAX_QPS || body > RAIL_IB_BODY_MAX ||
	    len < RAIL_IB_HDR_SIZE + body)
		return -EINVAL;
	rail_put_u64(p, m->nonce);
	p[8] = (uint8_t)m->ndevs;
	p[9] = (uint8_t)m->qps_per_dev;
	p[10] = (uint8_t)m->tc;
	p[11] = (uint8_t)m->sl;
	rail_put_u16(p + 12, (uint16_t)m->nqps);
	rail_put_u16(p + 14, (uint16_t)m->flags);
	rail_put_u64(p + 16, m->ctrl_addr);
	rail_put_u32(p + 24, m->refuse_code);
	rail_put_u64(p + 28, m->eager_addr);
	rail_put_u64(p + 36, m->aux_addr);
	rail_put_u32(p + 44, m->eager_slot_bytes);
	rail_put_u16(p + 48, (uint16_t)m->eager_slots);
	rail_put_u16(p + 50, 0);
	p += FIXED_SIZE;
	for (int i = 0; i < m->ndevs; i++, p += DEV_SIZE) {
		const struct rail_ib_wire_dev *d = &m->devs[i];

		rail_put_u16(p, d->lid);
		p[2] = d->port;
		p[3] = d->link_layer;
		p[4] = d->mtu;
		p[5] = d->gid_index;
		rail_put_u16(p + 6, d->devnum);
		rail_put_u32(p + 8, d->ctrl_rkey);
		memcpy(p + 12, d->gid, 16);
	}
	for (int i = 0; i < m->nqps; i++, p += 4)
		rail_put_u32(p, m->qpn[i]);
	*p++ = (uint8_t)text_len;
	memcpy(p, m->text, text_len);
	p += text_len;
	*p++ = (uint8_t)m->nece;
	for (int i = 0; i < m->nece; i++, p += ECE_SIZE) {
		rail_put_u32(p, m->ece[i].vendor_id);
		rail_put_u32(p + 4, m->ece[i].options);
		rail_put_u32(p + 8, m->ece[i].comp_mask);
	}
	if (has_move(m->type))
		move_put(&m->move, p);
	rail_put_u32(buf, RAIL_IB_WIRE_MAGIC);
	rail_put_u16(buf + 4, RAIL_IB_WIRE_VERSION);
	rail_put_u16(buf + 6, (uint16_t)m->type);
	rail_put_u32(buf + 8, (uint32_t)body);
	rail_put_u32(buf + 12, rail_fnv1a(buf + RAIL_IB_HDR_SIZE, body));
	return (int)(RAIL_IB_HDR_SIZE + body);
}

int rail_ib_msg_header(const uint8_t *hdr, int *type, char *why, size_t why_len)
{
	uint32_t magic = rail_get_u32(hdr), body = rail_get_u32(hdr + 8);
	uint16_t version = rail_get_u16(hdr + 4), t = rail_get_u16(hdr + 6);

	if (magic != RAIL_IB_WIRE_MAGIC) {
		snprintf(why, why_len, "not a nccl-net-rail verbs handshake (magic 0x%08x): is "
			 "the peer the same plugin, with the verbs transport?", magic);
		return -EPROTO;
	}
	if (version != RAIL_IB_WIRE_VERSION) {
		snprintf(why, why_len, "handshake version %u, this plugin (%s) speaks %d: use the "
			 "same build on every node", version, RAIL_VERSION_STRING,
			 RAIL_IB_WIRE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (t < RAIL_IB_MSG_HELLO || t > RAIL_IB_MSG_LAST || body < FIXED_SIZE + 2 ||
	    body > RAIL_IB_BODY_MAX) {
		snprintf(why, why_len, "handshake header corrupt (type %u, length %u)", t, body);
		return -EBADMSG;
	}
	*type = t;
	return (int)body;
}

static int decode_devs(const uint8_t *p, struct rail_ib_msg *m, char *why, size_t why_len)
{
	for (int i = 0; i < m->ndevs; i++, p += DEV_SIZE) {
		struct rail_ib_wire_dev *d = &m->devs[i];

		d->lid = rail_get_u16(p);
		d->port = p[2];
		d->link_layer = p[3];
		d->mtu = p[4];
		d->gid_index = p[5];
		d->devnum = rail_get_u16(p + 6);
		d->ctrl_rkey = rail_get_u32(p + 8);
		memcpy(d->gid, p + 12, 16);
		if (d->mtu < 1 || d->mtu > 5 || d->link_layer < 1 || d->link_layer > 2) {
			snprintf(why, why_len, "device %d: MTU code %u or link layer %u invalid", i,
				 d->mtu, d->link_layer);
			return -EBADMSG;
		}
	}
	return 0;
}

static int is_probe(int type)
{
	return type == RAIL_IB_MSG_PROBE || type == RAIL_IB_MSG_PROBE_ACK ||
	       type == RAIL_IB_MSG_PROBE_DONE;
}

/*
 * Devices and QPs a message of its type must carry: none for REFUSE,
 * MOVE_READY, PROBE_DONE and a refused PROBE_ACK; one and one for PROBE and
 * an answering PROBE_ACK; else at least one device and (but HELLO) QP.
 */
static int check_shape(const struct rail_ib_msg *m, char *why, size_t why_len)
{
	int none = m->type == RAIL_IB_MSG_REFUSE || m->type == RAIL_IB_MSG_MOVE_READY ||
		   m->type == RAIL_IB_MSG_PROBE_DONE ||
		   (m->type == RAIL_IB_MSG_PROBE_ACK && m->refuse_code);
	int bad;

	if (is_probe(m->type))
		bad = m->refuse_code > RAIL_IB_PROBE_FAILED || m->nece ||
		      (none ? m->ndevs || m->nqps : m->ndevs != 1 || m->nqps != 1 || m->refuse_code);
	else
		bad = !none && (m->ndevs < 1 || (m->type != RAIL_IB_MSG_HELLO && m->nqps < 1) ||
				(m->type == RAIL_IB_MSG_HELLO && m->qps_per_dev < 1));
	if (bad)
		snprintf(why, why_len, "handshake type %d with %d devices, %d QPs, %d QPs/device, "
			 "code %u", m->type, m->ndevs, m->nqps, m->qps_per_dev, m->refuse_code);
	return bad ? -EBADMSG : 0;
}

/* The eager ring an ACCEPT offers, and the credit word a READY names. */
static int check_eager(const struct rail_ib_msg *m, char *why, size_t why_len)
{
	uint32_t n = (uint32_t)m->eager_slots, b = m->eager_slot_bytes;

	if (m->type == RAIL_IB_MSG_ACCEPT && n &&
	    ((n & (n - 1)) || n < 2 || n > RAIL_IB_EAGER_MAX_SLOTS || b < 64 ||
	     b > RAIL_IB_EAGER_MAX_SLOT_BYTES || b % 64 || !m->eager_addr || !m->aux_addr ||
	     m->eager_addr % 64)) {
		snprintf(why, why_len, "handshake offers a bad eager ring (%u slots of %u bytes at "
			 "0x%llx, want word 0x%llx)", n, b, (unsigned long long)m->eager_addr,
			 (unsigned long long)m->aux_addr);
		return -EBADMSG;
	}
	if (m->type == RAIL_IB_MSG_READY && (!m->aux_addr || m->aux_addr % 8)) {
		snprintf(why, why_len, "handshake names a bad credit word (0x%llx)",
			 (unsigned long long)m->aux_addr);
		return -EBADMSG;
	}
	if (m->type == RAIL_IB_MSG_READY &&
	    (m->flags & RAIL_IB_READY_ORDER_MASK) > RAIL_IB_ORDER_SAFE) {
		snprintf(why, why_len, "handshake asks for eager ring order %d (0 auto, 1 in-order, "
			 "2 safe)", m->flags & RAIL_IB_READY_ORDER_MASK);
		return -EBADMSG;
	}
	return 0;
}

int rail_ib_msg_decode(const uint8_t *buf, size_t len, struct rail_ib_msg *m, char *why,
		       size_t why_len)
{
	const uint8_t *p = buf + RAIL_IB_HDR_SIZE, *text;
	struct rail_ib_msg out;
	size_t need;
	int body, err;

	if (len < RAIL_IB_HDR_SIZE) {
		snprintf(why, why_len, "handshake truncated (%zu bytes)", len);
		return -EBADMSG;
	}
	body = rail_ib_msg_header(buf, &out.type, why, why_len);
	if (body < 0)
		return body;
	if (len < RAIL_IB_HDR_SIZE + (size_t)body) {
		snprintf(why, why_len, "handshake truncated (%zu of %d bytes)", len,
			 RAIL_IB_HDR_SIZE + body);
		return -EBADMSG;
	}
	if (rail_fnv1a(p, (size_t)body) != rail_get_u32(buf + 12)) {
		snprintf(why, why_len, "handshake corrupt (checksum)");
		return -EBADMSG;
	}
	memset(&out.nonce, 0, sizeof(out) - offsetof(struct rail_ib_msg, nonce));
	out.nonce = rail_get_u64(p);
	out.ndevs = p[8];
	out.qps_per_dev = p[9];
	out.tc = p[10];
	out.sl = p[11];
	out.nqps = rail_get_u16(p + 12);
	out.flags = rail_get_u16(p + 14);
	out.ctrl_addr = rail_get_u64(p + 16);
	out.refuse_code = rail_get_u32(p + 24);
	out.eager_addr = rail_get_u64(p + 28);
	out.aux_addr = rail_get_u64(p + 36);
	out.eager_slot_bytes = rail_get_u32(p + 44);
	out.eager_slots = rail_get_u16(p + 48);
	need = FIXED_SIZE + (size_t)out.ndevs * DEV_SIZE + (size_t)out.nqps * 4 + 1;
	if (out.ndevs > RAIL_MAX_VDEV_DEVS || out.nqps > RAIL_IB_WIRE_MAX_QPS ||
	    need + 1 > (size_t)body || p[need - 1] > RAIL_IB_REFUSE_TEXT ||
	    need + p[need - 1] + 1 > (size_t)body) {
		snprintf(why, why_len, "handshake corrupt (%d devices, %d QPs, %d body bytes)",
			 out.ndevs, out.nqps, body);
		return -EBADMSG;
	}
	text = p + need - 1;
	out.nece = text[1 + text[0]];
	if ((out.nece && out.nece != out.ndevs) ||
	    need + text[0] + 1 + (size_t)out.nece * ECE_SIZE > (size_t)body ||
	    (!has_move(out.type) &&
	     need + text[0] + 1 + (size_t)out.nece * ECE_SIZE != (size_t)body)) {
		snprintf(why, why_len, "handshake corrupt (%d ECE entries for %d devices, %d body "
			 "bytes)", out.nece, out.ndevs, body);
		return -EBADMSG;
	}
	err = check_shape(&out, why, why_len);
	if (!err)
		err = check_eager(&out, why, why_len);
	if (!err)
		err = decode_devs(p + FIXED_SIZE, &out, why, why_len);
	if (err)
		return err;
	p += FIXED_SIZE + (size_t)out.ndevs * DEV_SIZE;
	for (int i = 0; i < out.nqps; i++, p += 4)
		out.qpn[i] = rail_get_u32(p) & 0xffffff;
	memcpy(out.text, p + 1, p[0]);
	out.text[p[0]] = '\0';
	p += 2 + p[0];
	for (int i = 0; i < out.nece; i++, p += ECE_SIZE) {
		out.ece[i].vendor_id = rail_get_u32(p);
		out.ece[i].options = rail_get_u32(p + 4);
		out.ece[i].comp_mask = rail_get_u32(p + 8);
	}
	if (has_move(out.type)) {
		err = move_get(p, (size_t)(buf + RAIL_IB_HDR_SIZE + body - p), &out.move, why,
			       why_len);
		if (err)
			return err;
	}
	*m = out;
	return 0;
}

void rail_ib_cts_encode(const struct rail_ib_cts *c, uint8_t *p)
{
	rail_put_u64(p, c->addr);
	rail_put_u32(p + 8, (uint32_t)c->size);
	rail_put_u32(p + 12, c->ord);
	for (int i = 0; i < RAIL_MAX_VDEV_DEVS; i++)
		rail_put_u32(p + 16 + 4 * i, c->rkey[i]);
	rail_put_u32(p + 48, (uint32_t)c->tag);
	p[52] = (uint8_t)c->nreqs;
	p[53] = (uint8_t)c->idx;
	rail_put_u16(p + 54, 0);
	rail_put_u32(p + 56, c->credits);
	rail_put_u32(p + 60, c->seq);
}

/*
 * A sequence number the NIC may be writing, read with one acquire load. The
 * NIC (and the fake device that models it) writes whole aligned 8-byte words
 * in address order, so where the u32 is the upper half of such a word the
 * load covers the whole word: the acquire then pairs with the very store that
 * carried the number, and everything the entry wrote before it is visible
 * (a 4-byte load of half a word pairs with nothing under ThreadSanitizer).
 */
static uint32_t load_u32(const uint8_t *p)
{
	/* little-endian on the wire: the upper half of the word is the u32 at p */
	if (((uintptr_t)p & 7) == 4)
		return (uint32_t)(le64toh(__atomic_load_n((const uint64_t *)(const void *)(p - 4),
							  __ATOMIC_ACQUIRE)) >> 32);
	return le32toh(__atomic_load_n((const uint32_t *)(const void *)p, __ATOMIC_ACQUIRE));
}

uint32_t rail_ib_cts_seq(const uint8_t *p)
{
	return load_u32(p + 60);
}

int rail_ib_cts_decode(const uint8_t *p, uint32_t expect_seq, int expect_idx,
		       struct rail_ib_cts *c, char *why, size_t why_len)
{
	struct rail_ib_cts out;

	if (rail_ib_cts_seq(p) != expect_seq)
		return -EAGAIN;
	out.addr = rail_get_u64(p);
	out.size = rail_get_u32(p + 8);
	out.ord = rail_get_u32(p + 12);
	for (int i = 0; i < RAIL_MAX_VDEV_DEVS; i++)
		out.rkey[i] = rail_get_u32(p + 16 + 4 * i);
	out.tag = (int32_t)rail_get_u32(p + 48);
	out.nreqs = p[52];
	out.idx = p[53];
	out.credits = rail_get_u32(p + 56);
	out.seq = expect_seq;
	if (out.nreqs < 1 || out.nreqs > RAIL_MAX_RECVS || out.idx != expect_idx ||
	    out.idx >= out.nreqs || out.size > RAIL_MAX_MSG_BYTES) {
		snprintf(why, why_len, "clear-to-send entry %d of CTS %u corrupt (nreqs %d, idx %d, "
			 "size %llu)", expect_idx, expect_seq - 1, out.nreqs, out.idx,
			 (unsigned long long)out.size);
		return -EBADMSG;
	}
	*c = out;
	return 0;
}

uint32_t rail_ib_imm_single(size_t size)
{
	return (uint32_t)size;
}

uint32_t rail_ib_imm_multi(int nreqs)
{
	return RAIL_IB_IMM_MULTI | (uint32_t)nreqs;
}

uint32_t rail_ib_imm_refused(int idx, size_t size)
{
	return RAIL_IB_IMM_REFUSED | ((uint32_t)idx << 27) |
	       (uint32_t)RAIL_MIN(size, (size_t)RAIL_IB_IMM_REFUSED_SIZE_MAX);
}

uint32_t rail_ib_imm_eager(void)
{
	return RAIL_IB_IMM_EAGER_VALUE;
}

uint32_t rail_ib_imm_ring(uint32_t seq)
{
	return RAIL_IB_IMM_RING | (seq & RAIL_IB_IMM_RING_SEQ);
}

int rail_ib_imm_decode(uint32_t imm, uint64_t *value, int *idx)
{
	*idx = 0;
	if ((imm & RAIL_IB_IMM_REFUSED) == RAIL_IB_IMM_REFUSED) {
		*idx = (int)((imm >> 27) & 7);
		*value = imm & RAIL_IB_IMM_REFUSED_SIZE_MAX;
		return RAIL_IB_IMM_REFUSAL;
	}
	if ((imm & RAIL_IB_IMM_RING_MASK) == RAIL_IB_IMM_RING) {
		*value = imm & RAIL_IB_IMM_RING_SEQ;
		return RAIL_IB_IMM_RING_MSG;
	}
	if (imm & RAIL_IB_IMM_MULTI) {
		uint32_t n = imm & ~RAIL_IB_IMM_MULTI;

		if (n < 2 || n > RAIL_MAX_RECVS)
			return -EBADMSG;
		*value = n;
		return RAIL_IB_IMM_COUNT;
	}
	if (imm == RAIL_IB_IMM_EAGER_VALUE) {
		*value = 0;
		return RAIL_IB_IMM_EAGER;
	}
	if (imm > RAIL_MAX_MSG_BYTES)
		return -EBADMSG;
	*value = imm;
	return RAIL_IB_IMM_SIZE;
}

void rail_ib_sizes_encode(const uint32_t *sizes, int n, uint8_t *p)
{
	for (int i = 0; i < n; i++)
		rail_put_u32(p + 4 * i, sizes[i]);
}

int rail_ib_sizes_decode(const uint8_t *p, int n, uint32_t *sizes)
{
	for (int i = 0; i < n; i++) {
		uint32_t v = rail_get_u32(p + 4 * i);

		if (v > RAIL_MAX_MSG_BYTES && v != RAIL_IB_SIZE_EAGER)
			return -EBADMSG;
		sizes[i] = v;
	}
	return 0;
}

/* ---- the eager path ------------------------------------------------------ */

void rail_ib_eager_encode(const struct rail_ib_eager_hdr *h, uint8_t *p)
{
	rail_put_u32(p, h->size);
	rail_put_u32(p + 4, (uint32_t)h->tag);
	rail_put_u32(p + 8, h->ord);
	rail_put_u32(p + 12, h->seq);
}

uint32_t rail_ib_eager_seq(const uint8_t *p)
{
	return load_u32(p + 12);
}

int rail_ib_eager_decode(const uint8_t *p, uint32_t expect_seq, uint32_t max_payload,
			 struct rail_ib_eager_hdr *h, char *why, size_t why_len)
{
	struct rail_ib_eager_hdr out;

	if (rail_ib_eager_seq(p) != expect_seq)
		return -EAGAIN;
	out.size = rail_get_u32(p);
	out.tag = (int32_t)rail_get_u32(p + 4);
	out.ord = rail_get_u32(p + 8);
	out.seq = expect_seq;
	if (out.size > max_payload) {
		snprintf(why, why_len, "eager message %u corrupt: %u bytes in a slot that holds %u "
			 "(tag %d, ordinal %u)", expect_seq - 1, out.size, max_payload, out.tag,
			 out.ord);
		return -EBADMSG;
	}
	*h = out;
	return 0;
}

/*
 * LL words: content in bytes 0-3, flag in 4-7, the word little-endian (so
 * the content bytes are the payload's, in order); never 0 as a flag. Whole
 * words through memcpy and le/htole: one move each on a little-endian host.
 */
static uint32_t ll_flag(uint32_t seq)
{
	return seq << 1 | 1u;
}

static void ll_put(uint8_t *p, uint32_t content_le, uint64_t flag_hi)
{
	uint64_t w = htole64(flag_hi | le32toh(content_le));

	memcpy(p, &w, 8);
}

/* One word read whole (the NIC may be writing it): its flag, and its content at *content_le. */
static uint32_t ll_get(const uint8_t *p, uint32_t *content_le)
{
	uint64_t w = le64toh(__atomic_load_n((const uint64_t *)(const void *)p, __ATOMIC_RELAXED));

	*content_le = htole32((uint32_t)w);
	return (uint32_t)(w >> 32);
}

uint32_t rail_ib_ll_encode(const struct rail_ib_eager_hdr *h, const void *payload, uint8_t *out)
{
	uint64_t hi = (uint64_t)ll_flag(h->seq) << 32;
	uint32_t full = h->size / 4, rest = h->size % 4, v;
	const uint8_t *src = payload;

	for (uint32_t j = 0; j < full; j++, out += 8) {
		memcpy(&v, src + 4 * j, 4);
		ll_put(out, v, hi);
	}
	if (rest) {
		v = 0;
		memcpy(&v, src + 4 * full, rest);
		ll_put(out, v, hi);
		out += 8;
	}
	ll_put(out, htole32(h->ord), hi);
	ll_put(out + 8, htole32((uint32_t)h->tag), hi);
	ll_put(out + 16, htole32(h->size), hi);
	return rail_ib_ll_bytes(h->size);
}

int rail_ib_ll_ready(const uint8_t *end, uint32_t seq)
{
	uint32_t v;

	return ll_get(end - 8, &v) == ll_flag(seq);
}

int rail_ib_ll_head(const uint8_t *end, uint32_t seq, uint32_t max_payload,
		    struct rail_ib_eager_hdr *h, char *why, size_t why_len)
{
	uint32_t want = ll_flag(seq), size, tag, ord;

	if (ll_get(end - 8, &size) != want)
		return -EAGAIN;
	size = le32toh(size);
	if (size > max_payload || size > RAIL_IB_LL_MAX) {
		snprintf(why, why_len, "eager message %u corrupt: an LL image of %u bytes, where at "
			 "most %u fit", seq - 1, size, RAIL_MIN(max_payload, (uint32_t)RAIL_IB_LL_MAX));
		return -EBADMSG;
	}
	if (ll_get(end - 16, &tag) != want || ll_get(end - 24, &ord) != want)
		return -EAGAIN;
	h->size = size;
	h->tag = (int32_t)le32toh(tag);
	h->ord = le32toh(ord);
	h->seq = seq;
	return 0;
}

int rail_ib_ll_payload(const uint8_t *end, uint32_t seq, uint32_t size, uint8_t *dst)
{
	uint32_t want = ll_flag(seq), full = size / 4, rest = size % 4, v;
	const uint8_t *p = end - rail_ib_ll_bytes(size);

	/* Each word's content comes from the load that checked its flag. */
	for (uint32_t j = 0; j < full; j++, p += 8) {
		if (ll_get(p, &v) != want)
			return -EAGAIN;
		memcpy(dst + 4 * j, &v, 4);
	}
	if (rest) {
		if (ll_get(p, &v) != want)
			return -EAGAIN;
		memcpy(dst + 4 * full, &v, rest);
	}
	return 0;
}

int rail_ib_ll_decode(const uint8_t *end, uint32_t seq, uint32_t max_payload,
		      struct rail_ib_eager_hdr *h, uint8_t *payload_end, char *why, size_t why_len)
{
	int err = rail_ib_ll_head(end, seq, max_payload, h, why, why_len);

	return err ? err : rail_ib_ll_payload(end, seq, h->size, payload_end - h->size);
}

void rail_ib_want_encode(const struct rail_ib_want *w, uint8_t *p)
{
	rail_put_u32(p, (uint32_t)w->tag);
	rail_put_u32(p + 4, w->ord);
	rail_put_u32(p + 8, 0);
	rail_put_u32(p + 12, w->seq);
}

int rail_ib_want_decode(const uint8_t *p, uint32_t last_seq, struct rail_ib_want *w)
{
	uint32_t seq = load_u32(p + 12);

	if (seq == last_seq)
		return -EAGAIN;
	w->tag = (int32_t)rail_get_u32(p);
	w->ord = rail_get_u32(p + 4);
	w->seq = seq;
	return 0;
}

void rail_ib_credit_encode(uint32_t consumed, uint16_t want_ack, uint16_t flags, uint8_t *p)
{
	rail_put_u32(p, consumed);
	rail_put_u16(p + 4, want_ack);
	rail_put_u16(p + 6, (uint16_t)(flags | RAIL_IB_CREDIT_READY));
}

void rail_ib_credit_decode(const uint8_t *p, uint32_t *consumed, uint16_t *want_ack,
			   uint16_t *flags)
{
	uint64_t v = __atomic_load_n((const uint64_t *)(const void *)p, __ATOMIC_ACQUIRE);
	const uint8_t *b = (const uint8_t *)&v;

	*consumed = rail_get_u32(b);
	*want_ack = rail_get_u16(b + 4);
	*flags = rail_get_u16(b + 6);
}

/* ---- the handle's payload ------------------------------------------------ */

size_t rail_ib_handle_gids_encode(const uint8_t (*gids)[16], int n, uint8_t *payload)
{
	n = RAIL_MAX(0, RAIL_MIN(n, RAIL_IB_HANDLE_GIDS));
	memcpy(payload, gids, 16 * (size_t)n);
	return 16 * (size_t)n;
}

int rail_ib_handle_gids_decode(const uint8_t *payload, size_t len, uint8_t (*gids)[16])
{
	if (len % 16 || len > 16 * RAIL_IB_HANDLE_GIDS)
		return -EBADMSG;
	memcpy(gids, payload, len);
	return (int)(len / 16);
}
