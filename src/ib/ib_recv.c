/*
 * nccl-net-rail: the receive side of the verbs data path (the protocol is
 * described in ib_send.c): irecv, the clear-to-send writes in receive order,
 * the answers to them, and the receiver's progress (ring, want, credits).
 *
 * Receive k sits in recvs[k % 64] while in flight; CTS number j (counted
 * separately: a receive filled through the ring may need none) in
 * cts[j % 64] until its answers arrived, one per QP of its set.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

#define SLOT_MASK ((uint64_t)RAIL_IB_SLOTS - 1)
#define CTS_DEPTH_LIMIT 120	/* below the QP's CTS_DEPTH send WRs */

static int cts_room(struct rail_ib_comm *c, int qpi)
{
	const struct rail_ib_qp *q = &c->qps[qpi];

	return q->sq_posted - q->sq_retired < CTS_DEPTH_LIMIT;
}

static int recv_check_args(struct rail_ib_comm *c, int n, const size_t *sizes, void **mhandles)
{
	for (int i = 0; i < n; i++) {
		struct rail_ib_mh *mh = mhandles ? mhandles[i] : NULL;

		if (sizes[i] > RAIL_MAX_MSG_BYTES || (sizes[i] && !mh) ||
		    (mh && mh->magic != RAIL_IB_MH_MAGIC)) {
			RAIL_WARN("irecv from peer %s: buffer %d of %d (%zu bytes) has %s", c->peer, i,
				  n, sizes[i], sizes[i] > RAIL_MAX_MSG_BYTES ? "more than 1 GiB"
				  : "no valid registration (mhandle)");
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- clear-to-send ------------------------------------------------------- */

static void cts_fill(struct rail_ib_comm *c, uint64_t num, const struct rail_ib_req *r,
		     uint8_t *out)
{
	for (int i = 0; i < r->base.n; i++) {
		struct rail_ib_mh *mh = r->mhs[i];
		struct rail_ib_cts e;

		memset(&e, 0, sizeof(e));
		e.addr = (uintptr_t)r->bufs[i];
		e.size = r->sizes[i];
		for (int m = 0; mh && m < c->ndevs; m++)
			e.rkey[m] = mh->rkey[m];
		e.tag = r->tags[i];
		e.ord = r->ords[i];
		e.nreqs = r->base.n;
		e.idx = i;
		e.credits = c->e_head;
		e.seq = (uint32_t)(num + 1);
		rail_ib_cts_encode(&e, out + (size_t)i * RAIL_IB_CTS_SIZE);
	}
}

/* One receive WR per QP of the set, for the answer. */
static int post_recvs(struct rail_ib_comm *c, int first, int count)
{
	for (int j = 0; j < count; j++) {
		int qpi = first + j;
		struct ibv_recv_wr wr = { .wr_id = rail_ib_wrid(RAIL_IB_WR_RECV, (uint32_t)qpi, 0) };
		struct ibv_recv_wr *bad = NULL;
		char where[160];
		int ret = rail_ibv.post_recv(c->qps[qpi].qp, &wr, &bad);

		if (rail_unlikely(ret)) {
			ret = rail_verbs_err(ret);
			RAIL_WARN("ibv_post_recv on %s failed: %s", rail_ib_qp_where(c, qpi, where,
				  sizeof(where)), RAIL_ERRSTR(-ret));
			c->error = -ret;
			return -ret;
		}
	}
	return 0;
}

/*
 * Profiler: one event per receive WR posted for r's answer and buffer still
 * to fill, with the buffer's share of that QP (the sender's split of the
 * posted size); the opcode is the completion's, IBV_WC_RECV_RDMA_WITH_IMM.
 */
static void recv_events(struct rail_ib_comm *c, struct rail_ib_req *r, int first, int count)
{
	for (int j = 0; j < count; j++) {
		const struct rail_ib_qp *q = &c->qps[first + j];

		for (int i = 0; i < r->base.n; i++) {
			size_t off, len;

			if (!(r->pending & (1u << i)))
				continue;
			rail_ib_split_piece(r->sizes[i], j, count, &off, &len);
			rail_prof_ib(r->base.prof, i, q->member,
				     rail_ib_wrid(RAIL_IB_WR_RECV, (uint32_t)(first + j), 0),
				     IBV_WC_RECV_RDMA_WITH_IMM, q->qp->qp_num, len);
		}
	}
}

/* Write the CTS of r: 0, -EAGAIN (slot or send queue busy) or an error. */
static int cts_write(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	uint64_t num = c->cts_next, slot = num & SLOT_MASK;
	struct rail_ib_cts_state *st = &c->cts[slot];
	uint8_t *entries = c->cts_stage + slot * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	const struct rail_ib_qp *q;
	int first, count, err;

	rail_ib_qp_set(c, num, &first, &count);
	if (st->active || !cts_room(c, first)) {
		err = rail_ib_poll(c);
		if (err)
			return err;
		if (st->active || !cts_room(c, first))
			return -EAGAIN;
	}
	for (int i = 0; i < r->base.n; i++)	/* posted before a move: keys of the new device */
		if ((err = rail_ib_mh_keys(c, r->mhs[i])))
			return err;
	cts_fill(c, num, r, entries);
	if (rail_unlikely(r->base.prof != NULL))
		recv_events(c, r, first, count);
	err = post_recvs(c, first, count);
	q = &c->qps[first];
	if (!err)
		err = rail_ib_ctl_write(c, first, entries, (uint32_t)r->base.n * RAIL_IB_CTS_SIZE,
					c->remote_fifo_addr + slot * RAIL_MAX_RECVS *
								      RAIL_IB_CTS_SIZE,
					c->remote_fifo_rkey[q->remote_member], "clear-to-send");
	if (err)
		return err;
	memset(st, 0, sizeof(*st));
	st->r = r;
	st->num = num;
	st->active = 1;
	st->n = r->base.n;
	st->left = count;
	r->cts = (int64_t)num;
	r->had_cts = 1;
	c->cts_next++;
	c->base.st.cts++;
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_CTS_TX, (uint16_t)num, r->sizes[0],
			r->tags[0], r->base.n);
	return 0;
}

/* Receive k, if in flight. */
int rail_ib_cts_upto(struct rail_ib_comm *c, uint64_t k)
{
	if (c->cts_k < c->recv_lo)
		c->cts_k = c->recv_lo;	/* the ones before are complete */
	while (c->cts_k < k) {
		struct rail_ib_req *r = rail_ib_recv_at(c, c->cts_k);

		if (r && !r->done && r->pending && !r->had_cts) {
			int err = cts_write(c, r);

			if (err)
				return err;
		}
		c->cts_k++;
	}
	return 0;
}

/* Whether a buffer of r may get a message that only a CTS brings (t[i]: its tags). */
static int recv_needs_cts(struct rail_ib_comm *c, const struct rail_ib_req *r,
			  struct rail_ib_tag *const *t)
{
	if (!c->eager_slots)
		return 1;
	for (int i = 0; i < r->base.n; i++) {
		if (!(r->pending & (1u << i)))
			continue;
		if (r->sizes[i] > RAIL_IB_EAGER_MAX || (r->mhs[i] && r->mhs[i]->gpu))
			return 1;
		if (t[i]->wanted && !rail_ib_before(t[i]->want, r->ords[i]))
			return 1;
	}
	return 0;
}

static int recv_chores(struct rail_ib_comm *c, int credit_mode);

/* ---- irecv --------------------------------------------------------------- */

/* Fill r for receive k; ordinals from the tag table (counted by the caller). */
static int recv_fill(struct rail_ib_comm *c, struct rail_ib_req *r, int n, void **data,
		     const size_t *sizes, const int *tags, void **mhandles,
		     struct rail_ib_tag **t)
{
	r->seq = c->seq;
	r->cts = -1;
	r->pending = (uint8_t)((1u << n) - 1);
	for (int i = 0; i < n; i++) {
		r->sizes[i] = sizes[i];
		r->mhs[i] = mhandles ? mhandles[i] : NULL;
		r->bufs[i] = data[i];
		r->tags[i] = tags ? tags[i] : 0;
		if (!rail_ib_tag_get(&c->tags, r->tags[i])) {
			RAIL_WARN("irecv from peer %s: out of memory for the tag table", c->peer);
			return -ENOMEM;
		}
	}
	/* Every tag exists now: no lookup below moves the table. */
	for (int i = 0; i < n; i++) {
		uint32_t same = 0;

		t[i] = rail_ib_tag_get(&c->tags, r->tags[i]);
		for (int j = 0; j < i; j++)
			same += r->tags[j] == r->tags[i];
		r->ords[i] = t[i]->next + same;
	}
	return 0;
}

int rail_ib_irecv(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		  const size_t *sizes, const int *tags, void **mhandles)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_tag *t[RAIL_MAX_RECVS];
	uint64_t k = c->seq;
	int err;

	err = rail_ib_comm_check(c, "irecv");
	if (!err)
		err = recv_check_args(c, n, sizes, mhandles);
	if (err)
		return err;
	if (c->recvs[k & SLOT_MASK]) {
		err = rail_ib_poll(c);
		if (!err)
			err = rail_ib_recv_progress(c);
		if (err)
			return err;
		if (c->recvs[k & SLOT_MASK])
			return rail_ib_peer_check(c, "irecv") ? c->error : -EAGAIN;
	}
	err = recv_fill(c, r, n, data, sizes, tags, mhandles, t);
	if (err)
		return err;
	for (int i = 0; i < n; i++)
		t[i]->next++;	/* no tag added since: the pointers hold */
	c->recvs[k & SLOT_MASK] = r;
	c->seq++;
	/* Messages already in the ring first: a receive they fill needs no CTS. */
	err = c->eager_slots && rail_ib_ring_peek(c) ? rail_ib_ring_poll(c) : 0;
	if (!err && c->e_head != c->e_seen)
		err = rail_ib_ring_match_recv(c, r);
	if (!err && r->pending && recv_needs_cts(c, r, t)) {
		err = rail_ib_cts_upto(c, k + 1);
		if (err == -EAGAIN) {
			c->cts_owed = 1;
			err = 0;
		}
	}
	if (!err)
		err = recv_chores(c, RAIL_IB_CREDIT_BUSY);
	if (err) {
		/* The request goes back to NCCL: forget it (the comm is failed). */
		if (!c->error)
			c->error = err;
		if (r->cts >= 0)
			c->cts[r->cts & SLOT_MASK].r = NULL;
		c->recvs[k & SLOT_MASK] = NULL;
	}
	return err;
}

/* ---- completion ------------------------------------------------------------ */

static int on_refusal(struct rail_ib_comm *c, struct rail_ib_cts_state *st, int m, int idx,
		      uint64_t size)
{
	struct rail_ib_req *r = st->r;

	RAIL_WARN("receive %llu from peer %s on %s: the peer's message of %llu%s bytes does not "
		  "fit buffer %d of %zu bytes; the sender refused it (a send larger than its "
		  "receive is an error)", r ? (unsigned long long)r->seq : 0ull, c->peer,
		  c->res[m].dev->name, (unsigned long long)size,
		  size == RAIL_IB_IMM_REFUSED_SIZE_MAX ? " or more" : "", idx,
		  r && idx < r->base.n ? r->sizes[idx] : 0);
	c->error = -EMSGSIZE;
	if (r)
		r->error = -EMSGSIZE;
	return -EMSGSIZE;
}

/* Every answer to CTS st arrived: fill the buffers it carried data for. */
static int cts_answered(struct rail_ib_comm *c, struct rail_ib_cts_state *st, int m, int kind,
			uint64_t value)
{
	struct rail_ib_req *r = st->r;
	uint32_t got[RAIL_MAX_RECVS];

	st->active = 0;
	if (st->n == 1)
		got[0] = kind == RAIL_IB_IMM_EAGER ? RAIL_IB_SIZE_EAGER : (uint32_t)value;
	else if (rail_ib_sizes_decode(c->cmpl + (st->num & SLOT_MASK) * RAIL_MAX_RECVS * 4, st->n,
				      got))
		return rail_ib_protocol_error(c, m, "completion record corrupt");
	if (r)
		r->cts = -1;
	else
		c->base.st.cts_eager++;
	for (int i = 0; i < st->n; i++) {
		if (got[i] == RAIL_IB_SIZE_EAGER)
			continue;	/* comes (or came) through the ring */
		if (!r || !(r->pending & (1u << i)))
			return rail_ib_protocol_error(c, m, "data for a buffer already filled");
		if (got[i] > r->sizes[i]) {
			RAIL_WARN("receive %llu buffer %d from peer %s on %s: %u bytes arrived for a "
				  "%zu-byte buffer", (unsigned long long)r->seq, i, c->peer,
				  c->res[m].dev->name, got[i], r->sizes[i]);
			return rail_ib_protocol_error(c, m, "message beyond the posted buffer");
		}
		r->sizes[i] = got[i];
		r->pending &= (uint8_t)~(1u << i);
	}
	if (r)
		rail_ib_recv_check_done(c, r);
	return 0;
}

int rail_ib_on_answer(struct rail_ib_comm *c, int qpi, int m, const struct ibv_wc *wc)
{
	struct rail_ib_cts_state *st;
	uint64_t num, value = 0;
	uint32_t imm;
	int kind = -EBADMSG, idx;

	if (qpi >= c->nqps)
		return rail_ib_protocol_error(c, m, "receive completion on an unknown QP");
	imm = ntohl(wc->imm_data);
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc->wc_flags & IBV_WC_WITH_IMM))
		kind = rail_ib_imm_decode(imm, &value, &idx);
	if (kind == RAIL_IB_IMM_RING_MSG)	/* an eager message (order-safe), no answer */
		return rail_ib_ring_on_imm(c, qpi, m, (uint32_t)value);
	num = c->qps[qpi].ans_next;
	c->qps[qpi].ans_next += (uint64_t)(c->nqps / rail_ib_qps_per_msg(c));
	st = &c->cts[num & SLOT_MASK];
	if (!st->active || st->num != num || st->left <= 0)
		return rail_ib_protocol_error(c, m, "a write with immediate answering no "
					      "clear-to-send");
	if (kind == RAIL_IB_IMM_REFUSAL)
		return on_refusal(c, st, m, idx, value);
	if (kind < 0 || (kind == RAIL_IB_IMM_COUNT) != (st->n > 1) ||
	    (kind == RAIL_IB_IMM_COUNT && (int)value != st->n) || (st->imm && st->imm != imm))
		return rail_ib_protocol_error(c, m, "unexpected receive completion");
	st->imm = imm;
	if (--st->left)
		return 0;
	return cts_answered(c, st, m, kind, value);
}

/* Everything but the ring: the want word, owed CTSes, credits. */
static int recv_chores(struct rail_ib_comm *c, int credit_mode)
{
	int err = rail_ib_want_poll(c);

	if (!err && c->cts_owed) {
		err = rail_ib_cts_upto(c, c->seq);
		if (!err)
			c->cts_owed = 0;
		else if (err == -EAGAIN)
			err = 0;
	}
	if (!err)
		err = rail_ib_credit_return(c, credit_mode);
	return err;
}

int rail_ib_recv_progress(struct rail_ib_comm *c)
{
	uint32_t seen = c->e_seen;
	int err;

	if (c->error)
		return c->error;
	err = rail_ib_ring_poll(c);
	return err ? err
		   : recv_chores(c, seen == c->e_seen ? RAIL_IB_CREDIT_IDLE : RAIL_IB_CREDIT_BUSY);
}

int rail_ib_recv_fast(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	int err, got = 2, idle;

	if (r->base.type != RAIL_REQ_RECV || r->cts >= 0 || r->loops || c->cts_owed ||
	    !c->eager_slots || c->error || (++c->fast_polls & 15) == 0)
		return 0;
	if (c->eager_safe)
		got = rail_ib_ring_direct(c, r);
	if (got == 1) {
		err = rail_ib_credit_return(c, RAIL_IB_CREDIT_BUSY);
		return err ? err : 1;
	}
	/* Order-safe ring: arrivals with immediate are receive completions, once the trailer shows. */
	err = c->eager_safe && rail_ib_ring_due(c) ? rail_ib_poll(c) : 0;
	if (err)
		return err;
	/* got == 0: the next slot had no LL image, so only a completion can have brought one */
	idle = got == 0 ? c->e_placed == c->e_seen : !rail_ib_ring_peek(c);
	if (idle) {
		/* nothing new: the time to hand credits back (rail_ib_credit_return's idle rule) */
		err = c->e_head - c->e_returned >= (uint32_t)c->eager_slots / 4 || c->credit_owed
			      ? rail_ib_credit_return(c, RAIL_IB_CREDIT_IDLE)
			      : 0;
		return err ? err : 1;
	}
	err = rail_ib_ring_poll(c);
	if (!err)
		err = rail_ib_credit_return(c, RAIL_IB_CREDIT_BUSY);
	return err ? err : 1;
}

/* ---- after a move (ib_move.c) ----------------------------------------------------- */

/* Whether QP qpi still owes the answer to CTS st (its set has qpi, not answered on it). */
static int cts_owes(const struct rail_ib_comm *c, const struct rail_ib_cts_state *st, int qpi)
{
	int first, count;

	rail_ib_qp_set(c, st->num, &first, &count);
	return qpi >= first && qpi < first + count && c->qps[qpi].ans_next <= st->num;
}

int rail_ib_recv_replay_prepare(struct rail_ib_comm *c)
{
	int err = 0;

	for (int k = 0; k < RAIL_IB_SLOTS && !err; k++) {
		struct rail_ib_cts_state *st = &c->cts[k];

		if (!st->active)
			continue;
		st->left = 0;
		for (int q = 0; q < c->nqps; q++)
			st->left += cts_owes(c, st, q);
	}
	for (int q = 0; q < c->nqps && !err; q++)
		for (int k = 0; k < RAIL_IB_SLOTS && !err; k++)
			if (c->cts[k].active && cts_owes(c, &c->cts[k], q))
				err = post_recvs(c, q, 1);
	return err ? err : rail_ib_ring_replay(c);
}

/* CTS st again, in its slot, with the rkeys of the new device. */
static int cts_write_again(struct rail_ib_comm *c, const struct rail_ib_cts_state *st)
{
	uint64_t slot = st->num & SLOT_MASK;
	uint8_t *entries = c->cts_stage + slot * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	int first, count;
	char why[200];

	rail_ib_qp_set(c, st->num, &first, &count);
	for (int i = 0; i < st->n; i++) {
		uint8_t *p = entries + (size_t)i * RAIL_IB_CTS_SIZE;
		struct rail_ib_cts e;
		int err = st->r && i < st->r->base.n ? rail_ib_mh_keys(c, st->r->mhs[i]) : 0;

		if (err)
			return err;
		if (rail_ib_cts_decode(p, (uint32_t)(st->num + 1), i, &e, why, sizeof(why)))
			return rail_ib_protocol_error(c, 0, "a staged clear-to-send is corrupt");
		for (int m = 0; st->r && i < st->r->base.n && st->r->mhs[i] && m < c->ndevs; m++)
			e.rkey[m] = st->r->mhs[i]->rkey[m];	/* per member, as cts_fill */
		e.credits = c->e_head;
		rail_ib_cts_encode(&e, p);
	}
	return rail_ib_ctl_write(c, first, entries, (uint32_t)st->n * RAIL_IB_CTS_SIZE,
				 c->remote_fifo_addr + slot * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE,
				 c->remote_fifo_rkey[c->qps[first].remote_member],
				 "clear-to-send, again after a move");
}

int rail_ib_recv_replay_write(struct rail_ib_comm *c)
{
	int n = 0, err = 0;

	/* in CTS order: the sender takes them in order */
	for (uint64_t num = c->cts_next > RAIL_IB_SLOTS ? c->cts_next - RAIL_IB_SLOTS : 0;
	     num < c->cts_next && !err; num++) {
		const struct rail_ib_cts_state *st = &c->cts[num & SLOT_MASK];

		if (st->active && st->num == num) {
			err = cts_write_again(c, st);
			n++;
		}
	}
	if (!err)
		err = rail_ib_credit_return(c, RAIL_IB_CREDIT_FORCE);
	return err ? err : n;
}
