/*
 * nccl-net-rail: the eager path of the verbs transport (the protocol is
 * described in ib_send.c) and its flow control.
 *
 * Sender: a message of at most eager_max bytes from host memory, with a
 * credit, is written into ring slot e % slots as one signaled RDMA WRITE of
 * [payload][trailer] that ends at the end of the slot; the image is built in
 * the staging slot of the same index (registered), and goes inline when it
 * fits. Slot e is written only once the receiver consumed message
 * e - slots, so neither the ring slot nor the staging slot is in use.
 * Eager writes go on QP 0 (member 0 to the peer's member 0, whose rkey the
 * ring has), so they reach the ring in order.
 *
 * Receiver, in-order protocol: the trailer's seq (written last) says the
 * slot holds message e. That holds only where the NIC places the bytes of
 * one write in address order and the CPU sees them so: the receiver uses it
 * only when ibv_query_qp_data_in_order says so of the eager QP (whole
 * message), or NCCL_RAIL_IB_EAGER_ORDER=inorder; the ring is registered
 * without relaxed ordering.
 *
 * Receiver, order-safe protocol (everywhere else: adaptive routing,
 * out-of-order placement, relaxed PCIe ordering, non-x86 hosts): a payload
 * of at most RAIL_IB_LL_MAX bytes is written as an LL image (ib_wire.h) into
 * the slot's last RAIL_IB_LL_BYTES, and taken once every word carries its
 * seq's flag; the images with a trailer then end before that region
 * (eager_end). A larger message's write carries an immediate
 * (RAIL_IB_IMM_RING, the seq's low bits), and the slot is read only once its
 * receive completion was polled, which RC guarantees comes after the whole
 * payload, and after every earlier write of the QP (so LL messages whose
 * seq an immediate skips are placed). The receiver keeps slots + 16 receive
 * WRs posted on QP 0 (posting used ones again 16 at a time): the sender has
 * at most `slots` messages beyond the receiver's consumed count, so a write
 * never finds the receive queue empty. Answers to CTSes on QP 0 take
 * receive WRs from the same queue but bring their own.
 *
 * Either way each message is matched by (tag, ord) to a buffer of a receive
 * in flight, or waits in its slot until that receive is posted; a consumed
 * slot is handed back by counting the consumed prefix.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

#define EAGER_QP 0
/* A message the ring cannot take whose CTS normally comes by itself (a large receive). */
#define WANT_LARGE_NS 2000000ull
#define CREDIT_QP 0
#define RECV_CTL_LIMIT 120		/* as for CTS writes (ib_recv.c) */

/* ---- tag table ------------------------------------------------------------ */

struct rail_ib_tag *rail_ib_tag_get(struct rail_ib_tags *t, int32_t tag)
{
	for (int i = 0; i < t->n; i++)
		if (t->v[i].tag == tag)
			return &t->v[i];
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 4;
		struct rail_ib_tag *v = realloc(t->v, (size_t)cap * sizeof(*v));

		if (!v)
			return NULL;
		t->v = v;
		t->cap = cap;
	}
	memset(&t->v[t->n], 0, sizeof(t->v[0]));
	t->v[t->n].tag = tag;
	return &t->v[t->n++];
}

void rail_ib_tags_free(struct rail_ib_tags *t)
{
	free(t->v);
	memset(t, 0, sizeof(*t));
}

/* ---- sender ----------------------------------------------------------------- */

int rail_ib_eager_fits(const struct rail_ib_comm *c, size_t size, const struct rail_ib_mh *mh)
{
	return c->eager_slots && size <= c->eager_max && (!mh || !mh->gpu);
}

/* Both sides' one choice: an order-safe ring keeps each slot's last LL_BYTES for LL images. */
static void ring_set_order(struct rail_ib_comm *c, int safe)
{
	c->eager_safe = safe;
	c->eager_ll = safe;
	c->eager_end = c->eager_slot_bytes - (safe ? RAIL_IB_LL_BYTES : 0);
}

static const char *order_name(int safe)
{
	return safe ? "order-safe (small messages LL words with a flag each, polled in memory; larger "
		      "ones an RDMA write with immediate, taken from the CQ)"
		    : "in-order (each message one RDMA write, its trailer polled in memory)";
}

void rail_ib_credit_refresh(struct rail_ib_comm *c, uint32_t cts_credits)
{
	uint32_t consumed;
	uint16_t ack, flags;

	rail_ib_credit_decode(c->fifo + RAIL_IB_CREDIT_OFF, &consumed, &ack, &flags);
	if (!(flags & RAIL_IB_CREDIT_READY) || (flags & RAIL_IB_CREDIT_REFUSED))
		return;	/* a refusal carries no credits (rail_ib_eager_refused) */
	if (!c->ring_ready && c->eager_slots && !c->eager_safe) {	/* not turned by a move */
		ring_set_order(c, (flags & RAIL_IB_CREDIT_SAFE) != 0);
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s on %s: eager ring %s, as the "
			  "receiver chose", c->peer, c->res[0].dev->name, order_name(c->eager_safe));
	}
	c->ring_ready = 1;
	if (rail_ib_before(c->e_credit, consumed))
		c->e_credit = consumed;
	if (rail_ib_before(c->e_credit, cts_credits))
		c->e_credit = cts_credits;
	c->want_ack = ack;	/* one want at a time: the latest is the one */
}

/* Order-safe, larger than an LL image: the eager write carries its seq as an immediate. */
static int eager_write_imm(struct rail_ib_comm *c, const void *src, uint32_t len, uint64_t raddr,
			   uint32_t rkey, uint32_t seq)
{
	struct rail_ib_qp *q = &c->qps[EAGER_QP];
	struct ibv_sge sge = {
		.addr = (uintptr_t)src,
		.length = len,
		.lkey = c->res[q->member].scratch_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED | (len <= q->max_inline ? IBV_SEND_INLINE : 0),
		.imm_data = htonl(rail_ib_imm_ring(seq)),
	};

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	q->sq_signaled = ++q->sq_posted;
	wr.wr_id = rail_ib_wrid(RAIL_IB_WR_RETIRE, EAGER_QP, q->sq_posted);
	return rail_ib_post_send(c, EAGER_QP, &wr, "eager RDMA write with immediate");
}

int rail_ib_eager_send(struct rail_ib_comm *c, struct rail_ib_req *r, void *data, size_t size,
		       int tag, uint32_t ord, int *no_credit)
{
	uint32_t e = c->e_sent, mask = (uint32_t)c->eager_slots - 1, len, rkey;
	struct rail_ib_qp *q = &c->qps[EAGER_QP];
	struct rail_ib_eager_hdr h;
	uint64_t raddr;
	uint8_t *img;
	int err, ll;

	if (rail_unlikely(!c->ring_ready || e - c->e_credit >= (uint32_t)c->eager_slots)) {
		rail_ib_credit_refresh(c, c->e_credit);
		if (!c->ring_ready)
			return -EAGAIN;	/* the receiver's QPs may not take writes yet */
		if (e - c->e_credit >= (uint32_t)c->eager_slots) {
			*no_credit = 1;
			return -EAGAIN;
		}
	}
	if (!rail_ib_sq_room(c, EAGER_QP, 1, RAIL_IB_EARLY_DEPTH))
		return c->error ? c->error : -EAGAIN;
	img = c->sizes + RAIL_IB_STAGE_OFF + (size_t)(e & mask) * c->eager_slot_bytes;
	h.size = (uint32_t)size;
	h.tag = tag;
	h.ord = ord;
	h.seq = e + 1;
	/* Order-safe and small: LL words, at the end of the slot; else payload and trailer. */
	ll = c->eager_ll && size <= RAIL_IB_LL_MAX;
	if (ll) {
		len = rail_ib_ll_encode(&h, data, img);
		raddr = c->eager_slot_bytes - len;
	} else {
		len = (uint32_t)size + RAIL_IB_EAGER_TRAILER;
		if (size)
			memcpy(img, data, size);
		rail_ib_eager_encode(&h, img + size);
		raddr = c->eager_end - len;
	}
	raddr += c->remote_ring_addr + (uint64_t)(e & mask) * c->eager_slot_bytes;
	rkey = c->remote_cmpl_rkey[q->remote_member];
	if (rail_unlikely(r->base.prof != NULL))	/* the write's wr_id: the next retire count */
		rail_prof_ib(r->base.prof, 0, q->member,
			     rail_ib_wrid(RAIL_IB_WR_RETIRE, EAGER_QP, q->sq_posted + 1),
			     c->eager_safe && !ll ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
			     q->qp->qp_num, size);
	err = c->eager_safe && !ll
		      ? eager_write_imm(c, img, len, raddr, rkey, h.seq)
		      : rail_ib_ctl_write(c, EAGER_QP, img, len, raddr, rkey,
					  ll ? "eager RDMA write (LL)" : "eager RDMA write");
	if (err)
		return err;
	c->e_img[e & mask] = len | (ll ? RAIL_IB_IMG_LL : 0);	/* a move may write it again */
	c->e_sent++;
	c->base.st.eager++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_EAGER, (uint16_t)e, size, tag, 0);
	r->sizes[0] = size;
	r->tag = tag;
	r->done = 1;
	return 0;
}

/* The header of message e (size bytes), as staged at img. */
static int stage_hdr(struct rail_ib_comm *c, const uint8_t *img, uint32_t e, uint32_t size,
		     struct rail_ib_eager_hdr *h, char *why, size_t why_len)
{
	uint8_t payload[RAIL_IB_LL_MAX];

	if (c->eager_safe && size <= RAIL_IB_LL_MAX)
		return rail_ib_ll_decode(img + rail_ib_ll_bytes(size), e + 1, c->eager_max, h,
					 payload + sizeof(payload), why, why_len);
	return rail_ib_eager_decode(img + size, e + 1, c->eager_max, h, why, why_len);
}

/*
 * Whether the receiver refused one of our eager messages (larger than its
 * receive): then the comm fails here too, with both sizes in the WARN. One
 * load of the credit word: cheap enough for every isend and sender progress.
 */
static int eager_refusal(struct rail_ib_comm *c, const char *call, uint32_t sizes, uint16_t e16);

int rail_ib_eager_refused(struct rail_ib_comm *c, const char *call)
{
	uint32_t sizes;
	uint16_t e16, flags;

	if (!c->eager_slots)
		return 0;
	rail_ib_credit_decode(c->fifo + RAIL_IB_CREDIT_OFF, &sizes, &e16, &flags);
	if (rail_likely(!(flags & RAIL_IB_CREDIT_REFUSED)))
		return 0;
	return eager_refusal(c, call, sizes, e16);
}

static int eager_refusal(struct rail_ib_comm *c, const char *call, uint32_t sizes, uint16_t e16)
{
	uint32_t e, mask = (uint32_t)c->eager_slots - 1, size, room;
	struct rail_ib_eager_hdr h;
	const uint8_t *img;
	char tag[48] = "";

	size = sizes >> 16;
	room = sizes & 0xffff;
	/* Message e is one of the last `slots` sent: its image is still staged. */
	e = c->e_sent - (uint16_t)((uint16_t)c->e_sent - e16);
	img = c->sizes + RAIL_IB_STAGE_OFF + (size_t)(e & mask) * c->eager_slot_bytes;
	if (size <= c->eager_max && stage_hdr(c, img, e, size, &h, tag, sizeof(tag)) == 0 &&
	    h.size == size)
		snprintf(tag, sizeof(tag), ", tag %d", h.tag);
	else
		tag[0] = 0;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_REFUSAL_RX, (uint16_t)e, size, 0, (int32_t)room);
	RAIL_WARN("%s to peer %s on %s:%d qp 0x%x: the receiver refused eager message %u (%u "
		  "bytes%s): its receive buffer holds only %u bytes; a send larger than its "
		  "receive is an error (check that both ranks post matching sizes); the "
		  "connection is failed", call, c->peer, c->res[0].dev->hca->name,
		  c->res[0].dev->port, c->qps[EAGER_QP].qp->qp_num, e, size, tag, room);
	c->error = -EMSGSIZE;
	return -EMSGSIZE;
}

/*
 * The send (t->tag, t->next) of size bytes is refused for now: ask the
 * receiver for credits and a CTS when it may not know we need one.
 */
int rail_ib_want_maybe(struct rail_ib_comm *c, struct rail_ib_tag *t, size_t size, int no_credit)
{
	struct rail_ib_qp *q = &c->qps[EAGER_QP];
	uint8_t *stage = c->sizes + RAIL_IB_WANT_STAGE_OFF;
	/*
	 * A small message from GPU memory fits a small receive, which gets no
	 * CTS unasked: ask at once, unless this tag's receives are large.
	 */
	uint64_t delay = !no_credit && (size > c->eager_max || t->cts_big) ? WANT_LARGE_NS : 0;
	struct rail_ib_want w;
	int err;

	if (!c->eager_slots || (t->wanted && !rail_ib_before(t->want, t->next)))
		return 0;	/* the receiver writes every CTS, or was asked already */
	if (!c->ring_ready) {
		rail_ib_credit_refresh(c, c->e_credit);
		if (!c->ring_ready)
			return 0;	/* its QPs may not take writes yet */
	}
	/* per tag: sends of other tags refused in turn must not restart this one's delay */
	if (t->blk_ord != t->next || !t->blk_ns) {
		t->blk_ord = t->next;
		t->blk_ns = rail_now_ns();
	}
	if (delay && rail_now_ns() - t->blk_ns < delay)
		return 0;
	if (c->want_seq != c->want_ack) {
		rail_ib_credit_refresh(c, c->e_credit);
		if (c->want_seq != c->want_ack)
			return 0;	/* one at a time */
	}
	if (!rail_ib_sq_room(c, EAGER_QP, 1, RAIL_IB_EARLY_DEPTH))
		return c->error;
	w.tag = t->tag;
	w.ord = t->next;
	w.seq = (uint16_t)(c->want_seq + 1);
	rail_ib_want_encode(&w, stage);
	err = rail_ib_ctl_write(c, EAGER_QP, stage, RAIL_IB_WANT_SIZE, c->remote_want_addr,
				c->remote_cmpl_rkey[q->remote_member], "want");
	if (err)
		return err;
	c->want_seq++;
	c->base.st.wants++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_WANT_TX, c->want_seq, 0, t->tag, (int32_t)t->next);
	t->want = t->next;
	t->wanted = 1;
	return 0;
}

/* ---- receiver ------------------------------------------------------------------ */

static uint8_t *ring_slot(struct rail_ib_comm *c, uint32_t e)
{
	return c->cmpl + RAIL_IB_RING_OFF +
	       (size_t)(e & ((uint32_t)c->eager_slots - 1)) * c->eager_slot_bytes;
}

/* Message e's trailer, where a write with immediate ends (before the LL region if order-safe). */
static uint8_t *ring_trailer(struct rail_ib_comm *c, uint32_t e)
{
	return ring_slot(c, e) + c->eager_end - RAIL_IB_EAGER_TRAILER;
}

static struct rail_ib_ring_ent *ring_ent(struct rail_ib_comm *c, uint32_t e)
{
	return &c->ring[e & ((uint32_t)c->eager_slots - 1)];
}

/* Hand back the consumed prefix of the ring. */
static void ring_advance(struct rail_ib_comm *c)
{
	while (c->e_head != c->e_seen && ring_ent(c, c->e_head)->state == RAIL_IB_RING_DONE) {
		ring_ent(c, c->e_head)->state = RAIL_IB_RING_FREE;
		c->e_head++;
	}
}

/* Copy message e into GPU buffer i of r: an RDMA WRITE on the self-connected QP. */
static int ring_loop(struct rail_ib_comm *c, uint32_t e, struct rail_ib_req *r, int i,
		     const uint8_t *payload)
{
	struct rail_ib_devres *res = &c->res[0];
	struct rail_ib_ring_ent *s = ring_ent(c, e);
	struct ibv_sge sge = {
		.addr = (uintptr_t)payload,
		.length = s->h.size,
		.lkey = res->ctrl_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rail_ib_wrid(RAIL_IB_WR_LOOP, e & ((uint32_t)c->eager_slots - 1), 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	};
	int err;

	if (!res->flush_qp)
		return rail_ib_protocol_error(c, 0, "an eager message for a GPU buffer, and no "
					      "loopback QP to copy it");
	err = rail_ib_mh_keys(c, r->mhs[i]);	/* posted before a move: keys of the new device */
	if (err)
		return err;
	wr.wr.rdma.remote_addr = (uintptr_t)r->bufs[i];
	wr.wr.rdma.rkey = r->mhs[i]->rkey[0];
	err = rail_ib_loop_post(c, 0, &wr, "eager loopback copy");
	if (err)
		return err;
	s->state = RAIL_IB_RING_LOOP;
	c->base.st.loops++;
	s->r = r;
	s->idx = (int8_t)i;
	r->loops++;
	return 0;
}

/*
 * Tell the sender that message e (size bytes) does not fit its receive
 * (room bytes): a credit word with REFUSED, the last one this comm writes
 * (credit_return writes nothing once the comm failed). Best effort: the
 * comm fails here whatever happens to the write.
 */
/* One credit word to the sender's credit address (consumed, want_ack, flags). */
static int credit_write(struct rail_ib_comm *c, uint32_t consumed, uint16_t ack, uint16_t flags,
			const char *what)
{
	uint8_t *stage = c->cts_stage + RAIL_IB_CREDIT_STAGE_OFF;
	const struct rail_ib_qp *q = &c->qps[CREDIT_QP];
	int err;

	rail_ib_credit_encode(consumed, ack, flags | (c->eager_safe ? RAIL_IB_CREDIT_SAFE : 0),
			      stage);
	err = rail_ib_ctl_write(c, CREDIT_QP, stage, RAIL_IB_CREDIT_SIZE, c->remote_credit_addr,
				c->remote_fifo_rkey[q->remote_member], what);
	if (!err)
		c->base.st.credits++;
	return err;
}

static void ring_refuse(struct rail_ib_comm *c, uint32_t e, uint32_t size, uint32_t room)
{
	(void)credit_write(c, size << 16 | room, (uint16_t)e, RAIL_IB_CREDIT_REFUSED,
			   "eager refusal");
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_CREDIT_TX, (uint16_t)e, size, 0, -1);
}

/* Message e fills buffer i of r. */
static int ring_deliver(struct rail_ib_comm *c, uint32_t e, struct rail_ib_req *r, int i)
{
	struct rail_ib_ring_ent *s = ring_ent(c, e);
	uint32_t size = s->h.size;
	const uint8_t *payload = ring_trailer(c, e) - size;

	if (size > r->sizes[i]) {
		RAIL_WARN("receive %llu buffer %d of %d from peer %s on %s: the peer's eager message "
			  "%u of %u bytes (tag %d) does not fit the %zu-byte buffer; a send larger "
			  "than its receive is an error (the sender is told)",
			  (unsigned long long)r->seq, i, r->base.n, c->peer, c->res[0].dev->name, e,
			  size, s->h.tag, r->sizes[i]);
		ring_refuse(c, e, size, (uint32_t)r->sizes[i]);
		c->error = -EMSGSIZE;
		r->error = -EMSGSIZE;
		return -EMSGSIZE;
	}
	r->pending &= (uint8_t)~(1u << i);
	r->sizes[i] = size;
	c->base.st.eager++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_EAGER, (uint16_t)e, size, s->h.tag, 0);
	if (size && r->mhs[i] && r->mhs[i]->gpu)
		return ring_loop(c, e, r, i, payload);
	if (size)
		memcpy(r->bufs[i], payload, size);
	s->state = RAIL_IB_RING_DONE;
	rail_ib_recv_check_done(c, r);
	return 0;
}

/* The buffer of r that message e fills, or -1. */
static int ring_find(struct rail_ib_comm *c, uint32_t e, const struct rail_ib_req *r)
{
	const struct rail_ib_ring_ent *s = ring_ent(c, e);

	for (int i = 0; i < r->base.n; i++)
		if ((r->pending & (1u << i)) && r->tags[i] == s->h.tag && r->ords[i] == s->h.ord)
			return i;
	return -1;
}

/* Message e just arrived: the receive in flight it is for, if posted. */
static int ring_match_msg(struct rail_ib_comm *c, uint32_t e)
{
	for (uint64_t k = c->recv_lo; k < c->seq; k++) {
		struct rail_ib_req *r = c->recvs[k % RAIL_IB_SLOTS];
		int i;

		if (!r || r->seq != k || r->done)
			continue;
		i = ring_find(c, e, r);
		if (i >= 0)
			return ring_deliver(c, e, r, i);
	}
	return 0;
}

/*
 * The common case of a small message, order-safe ring: nothing waits in the
 * ring and the next message is an LL image for r, a one-buffer receive in
 * host memory. Its payload goes from the ring straight to r's buffer (a
 * word not yet placed: r's buffer may hold part of it, and the next test
 * writes it again). 1: r is complete; 0: no LL image has begun to show in
 * the next slot; 2: anything else, left to rail_ib_ring_poll, which also
 * names what is wrong.
 */
int rail_ib_ring_direct(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	uint32_t e = c->e_seen;
	const uint8_t *end = ring_slot(c, e) + c->eager_slot_bytes;
	struct rail_ib_ring_ent *s = ring_ent(c, e);
	struct rail_ib_eager_hdr h;
	char why[8];

	if (e != c->e_head || e != c->e_placed || r->base.n != 1 || (r->mhs[0] && r->mhs[0]->gpu) ||
	    !c->eager_ll)
		return 2;
	if (!rail_ib_ll_ready(end, e + 1))
		return 0;
	if (rail_ib_ll_head(end, e + 1, c->eager_max, &h, why, sizeof(why)) ||
	    h.tag != r->tags[0] || h.ord != r->ords[0] || h.size > r->sizes[0] ||
	    rail_ib_ll_payload(end, e + 1, h.size, r->bufs[0]))
		return 2;
	s->h = h;
	s->state = RAIL_IB_RING_FREE;	/* consumed at once */
	c->e_placed++;
	c->e_seen++;
	c->e_head++;
	c->base.st.eager++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_EAGER, (uint16_t)e, h.size, h.tag, 0);
	r->pending = 0;
	r->sizes[0] = h.size;
	rail_ib_recv_check_done(c, r);
	return 1;
}

int rail_ib_ring_match_recv(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	for (uint32_t e = c->e_head; e != c->e_seen && r->pending; e++) {
		int i, err;

		if (ring_ent(c, e)->state != RAIL_IB_RING_WAITING)
			continue;
		i = ring_find(c, e, r);
		if (i < 0)
			continue;
		err = ring_deliver(c, e, r, i);
		if (err)
			return err;
	}
	ring_advance(c);
	return 0;
}

int rail_ib_ring_peek(struct rail_ib_comm *c)
{
	const uint8_t *slot_end = ring_slot(c, c->e_seen) + c->eager_slot_bytes;

	if (c->eager_safe)
		return c->e_placed != c->e_seen ||
		       (c->eager_ll && rail_ib_ll_ready(slot_end, c->e_seen + 1));
	return rail_ib_eager_seq(slot_end - RAIL_IB_EAGER_TRAILER) == c->e_seen + 1;
}

/*
 * Order-safe ring: whether the next message's completion may be in the CQ.
 * Its trailer (every eager write carries one, with the message's seq) is
 * placed before the completion is written, so while the slot holds an older
 * seq there is nothing to poll for. A trailer placed early (out of order)
 * only costs a poll that finds nothing yet.
 */
int rail_ib_ring_due(struct rail_ib_comm *c)
{
	uint32_t e = c->e_placed;

	if (!c->eager_slots || e - c->e_head >= (uint32_t)c->eager_slots)
		return 1;
	return rail_ib_eager_seq(ring_trailer(c, e)) == e + 1;
}

/*
 * Order-safe ring: decode message e, an LL image or (its immediate came) a
 * payload with trailer. -EAGAIN: not all there yet; -EBADMSG (why): the
 * slot holds neither where a later message's immediate says e is placed.
 */
static int ring_take_safe(struct rail_ib_comm *c, uint32_t e, struct rail_ib_eager_hdr *h,
			  char *why, size_t why_len)
{
	uint8_t *slot = ring_slot(c, e), *trailer = ring_trailer(c, e);
	int err;

	if (e != c->e_placed && rail_ib_eager_seq(trailer) == e + 1)
		return rail_ib_eager_decode(trailer, e + 1, c->eager_max, h, why, why_len);
	if (!c->eager_ll && e == c->e_placed)
		return -EAGAIN;	/* no LL images: only an immediate says a message is there */
	if (!c->eager_ll) {
		snprintf(why, why_len, "eager message %u is placed (its immediate came) but its "
			 "slot holds no trailer of it (seq %u)", e, rail_ib_eager_seq(trailer));
		return -EBADMSG;
	}
	/* The payload goes where ring_deliver reads one that came with a trailer. */
	err = rail_ib_ll_decode(slot + c->eager_slot_bytes, e + 1, c->eager_max, h, trailer, why,
				why_len);
	if (err == -EAGAIN && e != c->e_placed) {
		snprintf(why, why_len, "eager message %u is placed (a later write with immediate "
			 "came) but its slot holds neither its trailer (seq %u) nor its LL image",
			 e, rail_ib_eager_seq(trailer));
		return -EBADMSG;
	}
	if (err)
		return err;
	if (e == c->e_placed)
		c->e_placed++;
	return 0;
}

int rail_ib_ring_poll(struct rail_ib_comm *c)
{
	char why[200];

	if (!c->eager_slots)
		return 0;
	while (c->e_seen - c->e_head < (uint32_t)c->eager_slots) {
		uint32_t e = c->e_seen;
		struct rail_ib_ring_ent *s = ring_ent(c, e);
		int err = c->eager_safe
				  ? ring_take_safe(c, e, &s->h, why, sizeof(why))
				  : rail_ib_eager_decode(ring_trailer(c, e), e + 1,
							 c->eager_max, &s->h, why, sizeof(why));

		if (err == -EAGAIN)
			break;
		if (err) {
			RAIL_WARN("connection from peer %s on %s: %s", c->peer, c->res[0].dev->name,
				  why);
			c->error = -EPROTO;
			return -EPROTO;
		}
		s->state = RAIL_IB_RING_WAITING;
		c->e_seen++;
		err = ring_match_msg(c, e);
		if (err)
			return err;
	}
	ring_advance(c);
	return 0;
}

/* ---- the ring's protocol: in-order single write or order-safe ------------ */

/* Order-safe: n more receive WRs on the eager QP, one chain. */
static int ring_recvs_post(struct rail_ib_comm *c, uint32_t n)
{
	struct ibv_recv_wr wrs[RAIL_IB_RING_RECV_BATCH], *bad = NULL;
	char where[160];

	while (n) {
		uint32_t k = RAIL_MIN(n, (uint32_t)RAIL_IB_RING_RECV_BATCH);
		int ret;

		for (uint32_t i = 0; i < k; i++) {
			memset(&wrs[i], 0, sizeof(wrs[i]));
			wrs[i].wr_id = rail_ib_wrid(RAIL_IB_WR_RECV, EAGER_QP, 0);
			wrs[i].next = i + 1 < k ? &wrs[i + 1] : NULL;
		}
		ret = rail_ibv.post_recv(c->qps[EAGER_QP].qp, wrs, &bad);
		if (rail_unlikely(ret)) {
			ret = rail_verbs_err(ret);
			RAIL_WARN("ibv_post_recv (eager ring, order-safe) on %s failed: %s; the receive "
				  "queue is full or the QP is in error", rail_ib_qp_where(c, EAGER_QP,
				  where, sizeof(where)), RAIL_ERRSTR(-ret));
			c->error = -ret;
			return -ret;
		}
		n -= k;
	}
	return 0;
}

/* Whether the NIC promises whole-message in-order placement on the eager QP; why says. */
static int ring_in_order(struct rail_ib_comm *c, char *why, size_t len)
{
	int ret;

	if (!rail_ibv.query_qp_data_in_order) {
		snprintf(why, len, "libibverbs lacks ibv_query_qp_data_in_order (before rdma-core "
			 "37): in-order placement is not promised");
		return 0;
	}
	ret = rail_ibv.query_qp_data_in_order(c->qps[EAGER_QP].qp, IBV_WR_RDMA_WRITE,
					      RAIL_IBV_DATA_IN_ORDER_RETURN_CAPS);
	if (ret > 0 && (ret & RAIL_IBV_DATA_IN_ORDER_WHOLE_MSG)) {
		snprintf(why, len, "ibv_query_qp_data_in_order(RDMA_WRITE) on qp 0x%x answers 0x%x: "
			 "whole-message in-order placement", c->qps[EAGER_QP].qp->qp_num, ret);
		return 1;
	}
	snprintf(why, len, "ibv_query_qp_data_in_order(RDMA_WRITE) on qp 0x%x answers %d: the "
		 "provider does not promise whole-message in-order placement (it may place out "
		 "of order: adaptive routing, relaxed PCIe ordering, a non-x86 host; or it does "
		 "not say)", c->qps[EAGER_QP].qp->qp_num, ret);
	return 0;
}

int rail_ib_eager_order_setup(struct rail_ib_comm *c, int peer_order)
{
	int mine = (int)rail_param_int(RAIL_P_IB_EAGER_ORDER), safe;
	char why[300];

	if (!c->eager_slots)
		return 0;
	if (mine == RAIL_IB_ORDER_SAFE || peer_order == RAIL_IB_ORDER_SAFE) {
		safe = 1;
		snprintf(why, sizeof(why), "NCCL_RAIL_IB_EAGER_ORDER=safe on the %s",
			 mine == RAIL_IB_ORDER_SAFE ? "receiver" : "sender");
	} else if (mine == RAIL_IB_ORDER_INORDER || peer_order == RAIL_IB_ORDER_INORDER) {
		safe = 0;
		snprintf(why, sizeof(why), "NCCL_RAIL_IB_EAGER_ORDER=inorder on the %s (only correct "
			 "where the NIC places each write in order)",
			 mine == RAIL_IB_ORDER_INORDER ? "receiver" : "sender");
	} else {
		safe = !ring_in_order(c, why, sizeof(why));
		c->eager_probed = 1;
	}
	ring_set_order(c, safe);
	RAIL_INFO(RAIL_LOG_NET, "connection from peer %s on %s: eager ring %s: %s", c->peer,
		  c->res[0].dev->name, order_name(c->eager_safe), why);
	if (!c->eager_safe)
		return 0;
	c->ring_recvs_owed = 0;
	return ring_recvs_post(c, (uint32_t)c->eager_slots + RAIL_IB_RING_RECV_BATCH);
}

int rail_ib_ring_recheck(struct rail_ib_comm *c)
{
	char why[300];

	if (!c->eager_slots || c->eager_safe || !c->eager_probed || ring_in_order(c, why, sizeof(why)))
		return 0;
	c->eager_safe = 1;	/* eager_end kept: the messages seen so far stay where they are */
	c->eager_ll = 0;
	c->e_placed = c->e_seen;
	RAIL_INFO(RAIL_LOG_NET, "connection from peer %s, moved to %s: eager ring order-safe from "
		  "now on, every message with an immediate (it was in-order: the old NIC promised "
		  "in-order placement): %s", c->peer, c->res[0].dev->name, why);
	return 1;
}

void rail_ib_ring_turn_safe(struct rail_ib_comm *c)
{
	if (!c->eager_slots || c->eager_safe)
		return;
	c->eager_safe = 1;
	c->eager_ll = 0;
	RAIL_INFO(RAIL_LOG_NET, "connection to peer %s on %s: eager ring order-safe from now on, "
		  "every message with an immediate, as the receiver chose after the move", c->peer,
		  c->res[0].dev->name);
}

int rail_ib_ring_on_imm(struct rail_ib_comm *c, int qpi, int m, uint32_t seq_bits)
{
	/* Messages between the last placed one and this one were LL images (placed before it). */
	uint32_t skip = (seq_bits - (c->e_placed + 1)) & RAIL_IB_IMM_RING_SEQ;
	char what[160];

	if (!c->eager_safe || qpi != EAGER_QP || !c->eager_slots)
		return rail_ib_protocol_error(c, m, "an eager message with immediate where none "
					      "was agreed");
	if (c->e_placed + skip - c->e_head >= (uint32_t)c->eager_slots) {
		snprintf(what, sizeof(what), "eager message with seq bits 0x%x where message %u "
			 "(%u consumed) was due", seq_bits, c->e_placed, c->e_head);
		return rail_ib_protocol_error(c, m, what);
	}
	c->e_placed += skip + 1;
	if (++c->ring_recvs_owed < RAIL_IB_RING_RECV_BATCH)
		return 0;
	c->ring_recvs_owed = 0;
	return ring_recvs_post(c, RAIL_IB_RING_RECV_BATCH);
}

int rail_ib_on_loop(struct rail_ib_comm *c, uint32_t slot)
{
	struct rail_ib_ring_ent *s;
	struct rail_ib_req *r;

	if (slot >= (uint32_t)c->eager_slots || c->ring[slot].state != RAIL_IB_RING_LOOP)
		return rail_ib_protocol_error(c, 0, "completion of an unknown loopback copy");
	s = &c->ring[slot];
	r = s->r;
	s->state = RAIL_IB_RING_DONE;
	s->r = NULL;
	if (c->error)
		return c->error;	/* r may be gone */
	r->loops--;
	rail_ib_recv_check_done(c, r);
	ring_advance(c);
	return 0;
}

/*
 * Credits go back when the receiver has nothing else to do (idle: a quarter
 * of the ring consumed), at once when half of it is (busy), or when forced
 * (a want's acknowledgement, "ready"): a write in the idle time of a
 * ping-pong costs the next message nothing.
 */
int rail_ib_credit_return(struct rail_ib_comm *c, int mode)
{
	const struct rail_ib_qp *q = &c->qps[CREDIT_QP];
	uint32_t owed = c->e_head - c->e_returned;
	int err;

	if (!c->eager_slots || c->error)
		return 0;	/* a failed comm's last word stays (a refusal) */
	if (c->credit_owed)
		mode = RAIL_IB_CREDIT_FORCE;
	if (mode == RAIL_IB_CREDIT_BUSY ? owed < (uint32_t)c->eager_slots / 2
	    : mode == RAIL_IB_CREDIT_IDLE ? owed < (uint32_t)c->eager_slots / 4 : 0)
		return 0;
	if (q->sq_posted - q->sq_retired >= RECV_CTL_LIMIT) {
		err = rail_ib_poll(c);
		if (err)
			return err;
		if (q->sq_posted - q->sq_retired >= RECV_CTL_LIMIT) {
			c->credit_owed = 1;
			return 0;
		}
	}
	err = credit_write(c, c->e_head, (uint16_t)c->want_seen, 0, "credit return");
	if (err)
		return err;
	c->e_returned = c->e_head;
	c->credit_owed = 0;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_CREDIT_TX, 0, 0, 0, (int32_t)c->e_head);
	return 0;
}

int rail_ib_want_poll(struct rail_ib_comm *c)
{
	struct rail_ib_want w;
	struct rail_ib_tag *t;

	if (!c->eager_slots ||
	    rail_ib_want_decode(c->cmpl + RAIL_IB_WANT_OFF, c->want_seen, &w) == -EAGAIN)
		return 0;
	t = rail_ib_tag_get(&c->tags, w.tag);
	if (!t) {
		RAIL_WARN("connection from peer %s: out of memory for the tag table", c->peer);
		c->error = -ENOMEM;
		return -ENOMEM;
	}
	if (!t->wanted || rail_ib_before(t->want, w.ord))
		t->want = w.ord;
	t->wanted = 1;
	c->want_seen = w.seq;
	c->base.st.wants++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_WANT_RX, w.seq, 0, w.tag, (int32_t)w.ord);
	c->cts_owed = 1;	/* CTSes for the receives in flight that have none */
	c->credit_owed = 1;	/* credits, and the acknowledgement */
	return 0;
}

/* ---- after a move (ib_move.c) ----------------------------------------------------- */

int rail_ib_eager_replay(struct rail_ib_comm *c, uint32_t from)
{
	uint32_t mask = (uint32_t)c->eager_slots - 1;
	const struct rail_ib_qp *q = &c->qps[EAGER_QP];
	int n = 0, err = 0;

	if (c->eager_slots && c->e_sent - from > (uint32_t)c->eager_slots)
		return rail_ib_protocol_error(c, 0, "after a move the receiver has seen fewer eager "
					      "messages than the ring holds");
	for (uint32_t e = from; c->eager_slots && e != c->e_sent && !err; e++, n++) {
		const uint8_t *img = c->sizes + RAIL_IB_STAGE_OFF + (size_t)(e & mask) *
								      c->eager_slot_bytes;
		uint32_t len = c->e_img[e & mask] & ~RAIL_IB_IMG_LL;
		int ll = !!(c->e_img[e & mask] & RAIL_IB_IMG_LL);
		uint64_t raddr = (ll ? c->eager_slot_bytes - len : c->eager_end - len) +
				 c->remote_ring_addr + (uint64_t)(e & mask) * c->eager_slot_bytes;
		uint32_t rkey = c->remote_cmpl_rkey[q->remote_member];

		err = c->eager_safe && !ll
			      ? eager_write_imm(c, img, len, raddr, rkey, e + 1)
			      : rail_ib_ctl_write(c, EAGER_QP, img, len, raddr, rkey,
						  "eager RDMA write, again after a move");
	}
	if (!err && c->want_seq != c->want_ack)	/* the last want, again: the receiver dedups */
		err = rail_ib_ctl_write(c, EAGER_QP, c->sizes + RAIL_IB_WANT_STAGE_OFF,
					RAIL_IB_WANT_SIZE, c->remote_want_addr,
					c->remote_cmpl_rkey[q->remote_member], "want, again");
	return err ? err : n;
}

int rail_ib_ring_replay(struct rail_ib_comm *c)
{
	int err = 0;

	if (c->eager_slots && c->eager_safe) {
		c->ring_recvs_owed = 0;
		err = ring_recvs_post(c, (uint32_t)c->eager_slots + RAIL_IB_RING_RECV_BATCH);
	}
	for (int k = 0; !err && k < c->eager_slots; k++) {
		struct rail_ib_ring_ent *s = &c->ring[k];
		struct rail_ib_req *r = s->r;

		if (s->state != RAIL_IB_RING_LOOP)
			continue;	/* a copy that completed before the drain is done */
		r->loops--;
		err = ring_loop(c, (uint32_t)k, r, s->idx, ring_trailer(c, (uint32_t)k) - s->h.size);
	}
	return err;
}
