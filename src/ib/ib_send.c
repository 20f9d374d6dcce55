/*
 * nccl-net-rail: the verbs data path, and its send side (layer 4 of
 * src/ib/, ib.h): isend, the CTS batches and the sender's progress. The
 * engine it posts and polls through: ib_engine.c.
 *
 * Matching. The i-th send with tag T fills the i-th receive buffer posted
 * with tag T (NCCL's rule: within a grouped receive the first unfilled
 * buffer with the tag; a send for a later receive waits). Both sides count
 * per tag: a message and the buffer it fills share (T, ord), ord being the
 * ordinal among the sends, and among the posted buffers, with tag T.
 *
 * A message travels one of two ways.
 *
 * Eager (ib_eager.c): a message of at most RAIL_IB_EAGER_MAX (4 KiB) bytes
 * from host memory is written at isend time, as ONE RDMA WRITE, into slot
 * e % 64 of the receiver's eager ring, e counting eager messages: the
 * payload, then a trailer {size, tag, ord, seq = e + 1}, seq last. The send
 * is complete at once (the data went inline into the WR, or was copied to
 * a registered staging slot); its CQE only retires the send-queue slot.
 * The receiver learns that message e arrived in one of two ways, chosen by
 * the receiver once its QPs are ready and told to the sender in every
 * credit word (NCCL_RAIL_IB_EAGER_ORDER, either side's "safe" wins):
 *   in-order: it polls the next slot's seq in memory from irecv and test.
 *     Correct only where the bytes of one write are placed in address
 *     order, so only where ibv_query_qp_data_in_order promises that for
 *     the whole message; no immediate, no receive WR.
 *   order-safe (everywhere else: adaptive routing, out-of-order placement,
 *     relaxed PCIe ordering, non-x86 hosts; rxe, which does not answer):
 *     a payload of at most RAIL_IB_LL_MAX (244) bytes goes as an LL image
 *     into the last 512 bytes of the slot: 8-byte words of 4 bytes of
 *     content and 4 of flag (from seq), each placed whole by the NIC in
 *     whatever order, so the message is there once every word's flag is
 *     its own (as NCCL's LL protocol); no immediate, no receive WR, and
 *     test() of a receive it fills copies it straight to the buffer. A
 *     larger one carries an immediate (RAIL_IB_IMM_RING | seq), and the
 *     slot is read only after its receive completion, which RC delivers
 *     after the whole payload (and after every earlier write: LL images
 *     skipped by the seq are placed); the receiver keeps 64 + 16 receive
 *     WRs posted on QP 0 for it, and test() polls the CQ once the trailer
 *     shows.
 * Either way it then finds the buffer (T, ord) among its receives in
 * flight (or keeps the message until that receive is posted), checks the
 * size against the posted one and copies it out (into GPU memory: an RDMA
 * WRITE on its self-connected QP). No CTS.
 *
 * Clear-to-send (CTS): the receiver writes the entries of a receive {addr,
 * size, rkey per member device, tag, ord, n, idx, credits, seq = CTS number
 * + 1} in one RDMA WRITE (inline when it fits, signaled every 16th per QP)
 * into the sender's FIFO slot (CTS number % 64), after posting one receive
 * WR on each QP of the CTS's set. A set is P consecutive QPs, P = the
 * larger side's device count (every QP with NCCL_IB_SPLIT_DATA_ON_QPS=1),
 * so that it spans every member device of a fused NIC on both sides; CTS
 * num uses set num % (nqps / P). The sender takes CTSes in order. On
 * loading one it marks the entries whose (T, ord) it already sent eagerly;
 * a send whose (T, ord) is in the current CTS goes there (a send larger
 * than the entry is refused: a REFUSED immediate, both sides fail). Once
 * every entry has its send or went eagerly, the sender posts, per QP of the
 * set, the data RDMA WRITEs chained (each message split in P pieces of
 * ceil(size / P) rounded up to 128 bytes, as NCCL; a QP past the end gets
 * none), the last an RDMA WRITE WITH IMMEDIATE (a separate zero-byte one
 * with adaptive routing when the message exceeds NCCL_IB_AR_THRESHOLD):
 *   n == 1: imm = size, or EAGER (the message went through the ring);
 *   n  > 1: imm = MULTI|n, and the first QP of the set writes the n sizes
 *           (EAGER for ring messages) into the completion record of the slot.
 * That last write is the answer to the CTS: answers on one QP arrive in
 * CTS order, which is how the receiver pairs them with its CTSes. RC
 * ordering within a QP puts the data before the immediate.
 *
 * When the receiver writes a CTS (ib_recv.c): at irecv, if a buffer may take
 * a message the ring cannot (posted size > 4 KiB, GPU memory; or the peer
 * offers no ring), and when the sender asks (a want, below). CTSes go out
 * in receive order: writing one for receive k first writes one for every
 * earlier receive in flight that has none, so that a sender, which takes
 * CTSes in order, never waits on a later receive's CTS. A receive completes
 * when each buffer is filled, either way; if the ring filled them all, an
 * unanswered CTS of it no longer matters to the receive: its answer (EAGER)
 * only frees the CTS slot.
 *
 * Ring flow control. The sender writes eager message e only if e -
 * consumed < 64, consumed being the receiver's count of messages taken out
 * of the ring (a prefix), which it puts into every CTS entry and writes
 * into the sender's credit word: once 16 are owed and it has nothing else
 * to do (a test() finding the ring empty: in a ping-pong that costs the
 * next message nothing), at once when 32 are owed. Its first credit word,
 * written when its QPs are ready (before accept returns), is the sender's
 * "go": a write reaching a QP not yet in RTR is dropped and retried only
 * after the QP timeout, so no eager or want write leaves before it.
 *
 * Want. A sender that cannot send (T, ord) now -- out of credits, or the
 * message cannot go eagerly (GPU memory, > 4 KiB) and the current CTS has
 * no entry for it -- writes a want {T, ord, seq} into the receiver's want
 * word: at once when out of credits or for a small GPU message (its receive
 * may be small, and small host receives get no CTS unasked), unless the
 * tag's last CTS entry was larger than the ring takes; then, as for a large
 * message, after 2 ms (its CTS normally comes by itself; it does not when
 * the receive is small: an error the CTS then reports); one want at a
 * time, the next after the receiver acknowledged it. The receiver
 * then returns its credits (acknowledging), writes a CTS for every receive
 * in flight that has none, and writes one at irecv for buffers (T, <= ord).
 * So the sender never waits for something the receiver does not know of,
 * and in steady state (small messages, credits flowing) the wire carries
 * the messages and a credit word per 16 of them, nothing else.
 *
 * A test() of a receive only the ring can complete looks at one word (the
 * next slot's seq; order-safe: polls the CQ) and does the full progress
 * every 16th call.
 *
 * Completion: a send request completes at post (eager; or a batch whose
 * writes are all inline, its CQE only retiring send-queue slots, bounded by
 * RAIL_IB_EARLY_DEPTH) or at its batch's signaled CQE, counted per member
 * device (events[]). CQs are polled 16 CQEs at a time from test(); a
 * receive comm's test() also polls the ring and the want word.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

#define SLOT_MASK ((uint64_t)RAIL_IB_SLOTS - 1)

/* ---- send: CTS batches -------------------------------------------------- */

/* Load CTS c->seq into the batch: 0, -EAGAIN (not there yet) or an error. */
static int batch_load(struct rail_ib_comm *c)
{
	struct rail_ib_batch *b = &c->batch;
	const uint8_t *slot = c->fifo + (c->seq & SLOT_MASK) * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	uint32_t seq = (uint32_t)(c->seq + 1);
	char why[200];
	int err;

	err = rail_ib_cts_decode(slot, seq, 0, &b->cts[0], why, sizeof(why));
	for (int i = 1; !err && i < b->cts[0].nreqs; i++)
		err = rail_ib_cts_decode(slot + (size_t)i * RAIL_IB_CTS_SIZE, seq, i, &b->cts[i],
					 why, sizeof(why));
	if (err == -EBADMSG) {
		RAIL_WARN("isend to peer %s: %s", c->peer, why);
		c->error = -EPROTO;
		return -EPROTO;
	}
	if (err)
		return err;
	b->matched = 0;
	b->eager = 0;
	memset(b->reqs, 0, sizeof(b->reqs));
	for (int i = 0; i < b->cts[0].nreqs; i++) {
		struct rail_ib_tag *t = rail_ib_tag_get(&c->tags, b->cts[i].tag);

		if (!t) {
			RAIL_WARN("isend to peer %s: out of memory for the tag table", c->peer);
			c->error = -ENOMEM;
			return -ENOMEM;
		}
		/* Receives of this tag are large: their CTSes come by themselves. */
		t->cts_big = b->cts[i].size > c->eager_max;
		/* Already sent: it went through the eager ring. */
		if (rail_ib_before(b->cts[i].ord, t->next)) {
			b->eager |= (uint8_t)(1u << i);
			b->matched++;
		}
	}
	b->nreqs = b->cts[0].nreqs;
	rail_ib_credit_refresh(c, b->cts[0].credits);
	return 0;
}

/* The entry of the batch that send (tag, ord) fills, or -1. */
static int batch_find(const struct rail_ib_batch *b, int tag, uint32_t ord)
{
	for (int i = 0; i < b->nreqs; i++)
		if (!b->reqs[i] && !(b->eager & (1u << i)) && b->cts[i].tag == tag &&
		    b->cts[i].ord == ord)
			return i;
	return -1;
}

struct wr_list {
	int n;
	struct ibv_send_wr wr[RAIL_MAX_RECVS + 1];
	struct ibv_sge sge[RAIL_MAX_RECVS + 1];
	struct rail_ib_req *owner[RAIL_MAX_RECVS + 1];	/* the send a data write moves */
};

static struct ibv_send_wr *wr_add(struct wr_list *l, uint64_t laddr, uint32_t len, uint32_t lkey,
				  uint64_t raddr, uint32_t rkey, uint32_t max_inline, int can_inline)
{
	struct ibv_send_wr *wr = &l->wr[l->n];

	memset(wr, 0, sizeof(*wr));
	l->sge[l->n] = (struct ibv_sge){ .addr = laddr, .length = len, .lkey = lkey };
	wr->sg_list = len ? &l->sge[l->n] : NULL;
	wr->num_sge = len ? 1 : 0;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->send_flags = (can_inline && len && len <= max_inline) ? IBV_SEND_INLINE : 0;
	wr->wr.rdma.remote_addr = raddr;
	wr->wr.rdma.rkey = rkey;
	l->owner[l->n] = NULL;
	if (l->n > 0)
		l->wr[l->n - 1].next = wr;
	l->n++;
	return wr;
}

static void batch_data_wrs(const struct rail_ib_batch *b, const struct rail_ib_qp *q, int j,
			   int count, struct wr_list *l)
{

	for (int i = 0; i < b->nreqs; i++) {
		struct rail_ib_req *r = b->reqs[i];
		size_t off = 0, len;

		if (!r)
			continue;	/* went through the ring */
		len = r->sizes[0];
		if (count > 1)
			rail_ib_split_piece(r->sizes[0], j, count, &off, &len);
		if (!len)
			continue;
		wr_add(l, (uintptr_t)r->data + off, (uint32_t)len, r->mh->lkey[q->member],
		       b->cts[i].addr + off, b->cts[i].rkey[q->remote_member], q->max_inline,
		       !r->mh->gpu);
		l->owner[l->n - 1] = r;
	}
}

/* Profiler: one event per data write of a send that has a parent (prof.h). */
static void batch_events(const struct rail_ib_qp *q, const struct wr_list *l)
{
	for (int k = 0; k < l->n; k++) {
		struct rail_ib_req *r = l->owner[k];

		if (r && r->base.prof)
			rail_prof_ib(r->base.prof, 0, q->member, l->wr[k].wr_id, l->wr[k].opcode,
				     q->qp->qp_num, l->sge[k].length);
	}
}

/* Every write of the batch can go inline (host memory, small): it completes at post time. */
static int batch_is_early(struct rail_ib_comm *c, int first, int count)
{
	struct rail_ib_batch *b = &c->batch;
	uint32_t inl = UINT32_MAX;

	for (int j = 0; j < count; j++)
		inl = RAIL_MIN(inl, c->qps[first + j].max_inline);
	if (c->sent)	/* failover: the payloads are kept for a move (rail_ib_sent) */
		inl = RAIL_MIN(inl, (uint32_t)RAIL_IB_EARLY_COPY);
	if (b->nreqs > 1 && (uint32_t)b->nreqs * 4 > inl)
		return 0;
	for (int i = 0; i < b->nreqs; i++) {
		const struct rail_ib_req *r = b->reqs[i];

		if (r && r->sizes[0] && (r->mh->gpu || r->sizes[0] > inl))
			return 0;
	}
	return 1;
}

/* The immediate that answers a CTS of n entries whose messages have these sizes. */
static uint32_t answer_imm(int n, const uint32_t *sizes)
{
	return n > 1 ? rail_ib_imm_multi(n)
	       : sizes[0] != RAIL_IB_SIZE_EAGER ? rail_ib_imm_single(sizes[0]) : rail_ib_imm_eager();
}

/*
 * The batch's writes on QP qpi (piece j of count): the data of each entry
 * with a request, then the answer (imm); completed by lead's CQE, or, early
 * (lead NULL or payloads inline), by nothing NCCL waits for.
 */
static int batch_post_qp(struct rail_ib_comm *c, const struct rail_ib_batch *b, uint64_t num,
			 int qpi, int j, int count, struct rail_ib_req *lead, int early, uint32_t imm)
{
	struct rail_ib_qp *q = &c->qps[qpi];
	uint64_t slot = num & SLOT_MASK;
	uint64_t cmpl = c->remote_cmpl_addr + slot * RAIL_MAX_RECVS * 4;
	uint32_t cmpl_rkey = c->remote_cmpl_rkey[q->remote_member];
	struct ibv_send_wr *last;
	struct wr_list l;

	l.n = 0;
	batch_data_wrs(b, q, j, count, &l);
	if (b->nreqs > 1 && j == 0) {
		uint8_t *sz = c->sizes + slot * RAIL_MAX_RECVS * 4;

		last = wr_add(&l, (uintptr_t)sz, (uint32_t)b->nreqs * 4,
			      c->res[q->member].scratch_mr->lkey, cmpl, cmpl_rkey, q->max_inline, 1);
	} else if (b->nreqs > 1 || l.n == 0 || (c->ar && lead && lead->sizes[0] > c->ar_threshold)) {
		/* Adaptive routing may reorder writes; a write with immediate it does not. */
		last = wr_add(&l, 0, 0, 0, cmpl, cmpl_rkey, 0, 0);
	} else {
		last = &l.wr[l.n - 1];
	}
	last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	last->imm_data = htonl(imm);
	last->send_flags |= IBV_SEND_SIGNALED;
	if (early) {
		q->sq_signaled = q->sq_posted += (uint32_t)l.n;
		last->wr_id = rail_ib_wrid(RAIL_IB_WR_RETIRE, (uint32_t)qpi, q->sq_posted);
	} else {
		last->wr_id = (uintptr_t)lead;
		lead->events[q->member]++;
	}
	if (rail_unlikely(rail_prof_on()))
		batch_events(q, &l);
	return rail_ib_post_send(c, qpi, &l.wr[0], "RDMA write");
}

/* Room for an early batch of nwr WRs on every QP of the set. */
static int early_room(struct rail_ib_comm *c, int first, int count, int nwr)
{
	for (int j = 0; j < count; j++)
		if (!rail_ib_sq_room(c, first + j, nwr, RAIL_IB_EARLY_DEPTH))
			return 0;
	return 1;
}

/* Failover: what answers CTS c->seq, to post again what a failed path loses. */
static void sent_record(struct rail_ib_comm *c, struct rail_ib_req *lead, int early)
{
	const struct rail_ib_batch *b = &c->batch;
	struct rail_ib_sent *rec = &c->sent[c->seq & SLOT_MASK];

	rec->num_inv = ~c->seq;
	rec->nreqs = b->nreqs;
	rec->early = early;
	rec->acked = 0;
	rec->lead = early ? NULL : lead;
	for (int i = 0; i < b->nreqs; i++) {
		const struct rail_ib_req *r = b->reqs[i];

		rec->reqs[i] = early ? NULL : b->reqs[i];
		rec->sizes[i] = r ? (uint32_t)r->sizes[0] : RAIL_IB_SIZE_EAGER;
		if (early && r && r->sizes[0])
			memcpy(rec->copy[i], r->data, r->sizes[0]);
	}
}

/*
 * Answer CTS c->seq: every entry has its send or went eagerly. 0, -EAGAIN
 * (an all-eager answer found no room; retried later) or an error.
 */
static int batch_post(struct rail_ib_comm *c)
{
	struct rail_ib_batch *b = &c->batch;
	struct rail_ib_req *lead = NULL;
	uint32_t sizes[RAIL_MAX_RECVS];
	int first, count, early, err = 0;

	for (int i = 0; i < b->nreqs; i++) {
		struct rail_ib_req *r = b->reqs[i];

		sizes[i] = r ? (uint32_t)r->sizes[0] : RAIL_IB_SIZE_EAGER;
		if (!r)
			continue;
		/* after a move, matched before it: the keys of the device it is on now */
		err = rail_ib_mh_keys(c, r->mh);
		if (err)
			return err;
		if (!lead) {
			lead = r;
			lead->nmembers = 0;
		}
		lead->members[lead->nmembers++] = r;
		r->lead = lead;
	}
	if (b->nreqs > 1)
		rail_ib_sizes_encode(sizes, b->nreqs,
				     c->sizes + (c->seq & SLOT_MASK) * RAIL_MAX_RECVS * 4);
	rail_ib_qp_set(c, c->seq, &first, &count);
	early = !lead || batch_is_early(c, first, count);
	if (early && !early_room(c, first, count, b->nreqs + 1)) {
		if (!lead)
			return c->error ? c->error : -EAGAIN;
		early = 0;	/* no room: complete through the CQE instead */
	}
	if (c->sent)
		sent_record(c, lead, early);
	for (int j = 0; j < count && !err; j++)
		err = batch_post_qp(c, b, c->seq, first + j, j, count, lead, early,
				    answer_imm(b->nreqs, sizes));
	for (int i = 0; !err && early && lead && i < lead->nmembers; i++)
		lead->members[i]->done = 1;
	return err;
}

/* ---- after a move (ib_move.c): the pieces the old path lost, posted again -- */

/*
 * A record's batch, with the entries the receiver wrote again (new rkeys),
 * on the QPs that lost it: the data from the copies (early), from the
 * requests still in flight, or none (acked: placed already, only the answer
 * was lost). -EAGAIN: the receiver's CTS has not fully landed yet.
 */
static int sent_post_again(struct rail_ib_comm *c, const struct rail_ib_sent *rec, uint64_t n,
			   int first, int count)
{
	static struct rail_ib_mh host_mh;	/* early payloads go inline: no key is read */
	const uint8_t *slot = c->fifo + (n & SLOT_MASK) * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	struct rail_ib_req fake[RAIL_MAX_RECVS], *lead = rec->lead;
	struct rail_ib_batch b;
	char why[200];
	int err = 0;

	b.nreqs = rec->nreqs;
	for (int i = 0; i < rec->nreqs && !err; i++) {
		err = rail_ib_cts_decode(slot + (size_t)i * RAIL_IB_CTS_SIZE, (uint32_t)(n + 1), i,
					 &b.cts[i], why, sizeof(why));
		b.reqs[i] = rec->reqs[i];
		if (rec->early && rec->sizes[i] != RAIL_IB_SIZE_EAGER) {
			memset(&fake[i], 0, sizeof(fake[i]));
			fake[i].data = (void *)rec->copy[i];
			fake[i].sizes[0] = rec->sizes[i];
			fake[i].mh = &host_mh;
			b.reqs[i] = &fake[i];
			lead = lead ? lead : &fake[i];
		} else if (b.reqs[i]) {
			err = rail_ib_mh_keys(c, b.reqs[i]->mh);
		}
	}
	if (err == -EBADMSG)
		return rail_ib_protocol_error(c, 0, "a clear-to-send written again after a move "
					      "does not match what was sent for it");
	for (int j = 0; j < count && !err; j++)
		if (c->rp_ans[first + j] <= n)
			err = batch_post_qp(c, &b, n, first + j, j, count, rec->acked ? NULL : lead,
					    rec->early || rec->acked, answer_imm(rec->nreqs, rec->sizes));
	return err;
}

/* Sends whose completions the drain flushed and that owe nothing now: complete. */
static void sent_finish(struct rail_ib_comm *c)
{
	for (int k = 0; k < RAIL_IB_SLOTS; k++) {
		const struct rail_ib_sent *rec = &c->sent[k];
		struct rail_ib_req *lead = rec->lead;
		int left = 0;

		if (!lead || !lead->flushed || rail_ib_sent_num(rec) >= c->rp_end ||
		    rail_ib_sent_num(rec) + RAIL_IB_SLOTS < c->rp_end)
			continue;
		lead->flushed = 0;
		for (int m = 0; m < c->ndevs; m++)
			left |= lead->events[m];
		if (!left)
			rail_ib_send_complete(c, lead);
	}
}

static int send_replay(struct rail_ib_comm *c)
{
	struct rail_ib_batch *b = &c->batch;
	char why[200];

	while (c->rp_next != c->rp_end) {
		uint64_t n = c->rp_next;
		const struct rail_ib_sent *rec = &c->sent[n & SLOT_MASK];
		int first, count, lost = 0, err;

		rail_ib_qp_set(c, n, &first, &count);
		for (int j = 0; j < count; j++)
			lost |= c->rp_ans[first + j] <= n;
		if (rail_ib_sent_num(rec) == n && lost) {
			if (rail_ib_cts_seq(c->fifo + (n & SLOT_MASK) * RAIL_MAX_RECVS *
					    RAIL_IB_CTS_SIZE) != (uint32_t)(n + 1))
				return 0;	/* the receiver has not written it again yet */
			err = sent_post_again(c, rec, n, first, count);
			if (err)
				return err == -EAGAIN ? 0 : err;	/* the rest of it lands later */
		}
		c->rp_next++;
		if (c->rp_next == c->rp_end)
			sent_finish(c);
	}
	if (!c->batch_stale)
		return 0;
	if (b->nreqs) {
		const uint8_t *slot = c->fifo + (c->seq & SLOT_MASK) * RAIL_MAX_RECVS *
						       RAIL_IB_CTS_SIZE;

		if (rail_ib_cts_seq(slot) != (uint32_t)(c->seq + 1))
			return 0;
		for (int i = 0; i < b->nreqs; i++) {
			int err = rail_ib_cts_decode(slot + (size_t)i * RAIL_IB_CTS_SIZE,
						     (uint32_t)(c->seq + 1), i, &b->cts[i], why,
						     sizeof(why));

			if (err == -EAGAIN)
				return 0;	/* the rest of it lands later */
			if (err)
				return rail_ib_protocol_error(c, 0, "the clear-to-send being matched, "
							      "written again after a move, is corrupt");
		}
	}
	c->batch_stale = 0;
	return 0;
}

/* Take the CTSes that have arrived, answering those whose messages all went eagerly. */
static int batch_advance(struct rail_ib_comm *c)
{
	struct rail_ib_batch *b = &c->batch;

	if (rail_unlikely(c->rp_next != c->rp_end || c->batch_stale)) {
		int err = send_replay(c);

		if (err || c->rp_next != c->rp_end || c->batch_stale)
			return err;
	}
	for (;;) {
		int err;

		if (b->nreqs == 0) {
			/* the common case on every isend and test: no new CTS (its seq not there) */
			if (rail_ib_cts_seq(c->fifo + (c->seq & SLOT_MASK) * RAIL_MAX_RECVS *
					    RAIL_IB_CTS_SIZE) != (uint32_t)(c->seq + 1))
				return 0;
			err = batch_load(c);
			if (err)
				return err == -EAGAIN ? 0 : err;
		}
		if (b->matched < b->nreqs)
			return 0;
		err = batch_post(c);
		if (err)
			return err == -EAGAIN ? 0 : err;
		b->nreqs = 0;
		rail_flight_add(&c->base.fl, 0, RAIL_FEV_CTS_RX, (uint16_t)c->seq, 0, 0, b->nreqs);
		c->seq++;
		c->base.st.cts++;
		c->base.st.cts_eager++;
	}
}

/*
 * Tell the receiver that the message for buffer idx does not fit, so that
 * its receive fails too instead of waiting forever; the comm is dead.
 */
static int send_refusal(struct rail_ib_comm *c, int idx, size_t size)
{
	int first, count;
	struct rail_ib_qp *q;
	struct wr_list l;

	rail_ib_qp_set(c, c->seq, &first, &count);
	q = &c->qps[first];
	l.n = 0;
	wr_add(&l, 0, 0, 0, c->remote_cmpl_addr, c->remote_cmpl_rkey[q->remote_member], 0, 0);
	l.wr[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	l.wr[0].imm_data = htonl(rail_ib_imm_refused(idx, size));
	if (rail_ib_post_send(c, first, &l.wr[0], "refusal") == 0)
		c->error = -EMSGSIZE;
	return -EMSGSIZE;
}

static int send_match(struct rail_ib_comm *c, struct rail_ib_req *r, int i, size_t size, int tag,
		      struct rail_ib_mh *mh)
{
	struct rail_ib_batch *b = &c->batch;

	if (size > b->cts[i].size) {
		RAIL_WARN("isend of %zu bytes (tag %d) to peer %s on %s: the receiver posted only "
			  "%llu bytes for it (clear-to-send %llu, buffer %d of %d); a send larger "
			  "than its receive is an error", size, tag, c->peer, c->res[0].dev->name,
			  (unsigned long long)b->cts[i].size, (unsigned long long)c->seq, i,
			  b->nreqs);
		return send_refusal(c, i, size);
	}
	r->sizes[0] = size;
	r->mh = mh;
	r->tag = tag;
	r->seq = c->seq;
	b->reqs[i] = r;
	b->matched++;
	return 0;
}

/* Send r into entry i of the current CTS; answers the CTS once it is complete. */
static int send_cts(struct rail_ib_comm *c, struct rail_ib_req *r, int i, size_t size, int tag,
		    struct rail_ib_mh *mh)
{
	struct rail_ib_batch *b = &c->batch;
	int err = send_match(c, r, i, size, tag, mh);

	/* after a move, lost pieces go first, and the entry's keys must be the new ones */
	if (err || b->matched < b->nreqs || c->batch_stale || c->rp_next != c->rp_end)
		return err;
	err = batch_post(c);
	if (err) {
		/* The requests already handed out fail in test(); this one is returned. */
		for (int j = 0; j < b->nreqs; j++)
			if (b->reqs[j])
				b->reqs[j]->error = err;
	}
	rail_flight_add(&c->base.fl, 0, RAIL_FEV_CTS_RX, (uint16_t)c->seq,
			b->cts[0].size, b->cts[0].tag, b->nreqs);
	b->nreqs = 0;
	c->seq++;
	c->base.st.cts++;
	return err;
}

int rail_ib_isend(struct rail_comm *comm, struct rail_req *req, void *data, size_t size, int tag,
		  void *mhandle)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_mh *mh = mhandle;
	struct rail_ib_tag *t;
	int err, i, no_credit = 0;

	err = rail_ib_comm_check(c, "isend");
	if (!err)
		err = rail_ib_eager_refused(c, "isend");
	if (err)
		return err;
	if (rail_unlikely((size && !mh) || (mh && mh->magic != RAIL_IB_MH_MAGIC))) {
		RAIL_WARN("isend of %zu bytes to peer %s: no valid registration (mhandle %p)", size,
			  c->peer, mhandle);
		return -EINVAL;
	}
	err = batch_advance(c);
	if (err)
		return err;
	t = rail_ib_tag_get(&c->tags, tag);
	if (!t) {
		RAIL_WARN("isend to peer %s: out of memory for the tag table", c->peer);
		return -ENOMEM;
	}
	r->data = data;
	i = c->batch.nreqs ? batch_find(&c->batch, tag, t->next) : -1;
	if (i >= 0) {
		err = send_cts(c, r, i, size, tag, mh);
		if (!err)
			t->next++;
		return err;
	}
	if (rail_ib_eager_fits(c, size, mh)) {
		err = rail_ib_eager_send(c, r, data, size, tag, t->next, &no_credit);
		if (!err)
			t->next++;
		if (err != -EAGAIN)
			return err;
	}
	/* Its CTS is not here (a later one, or not written yet): NCCL retries. */
	err = rail_ib_want_maybe(c, t, size, no_credit);
	if (err)
		return err;
	if (rail_ib_peer_check(c, "isend"))
		return c->error;
	return -EAGAIN;
}

/* Sender progress besides the CQ (test): a refusal from the receiver, the CTSes. */
int rail_ib_send_progress(struct rail_ib_comm *c)
{
	int err = rail_ib_eager_refused(c, "test");

	return err ? err : batch_advance(c);
}
