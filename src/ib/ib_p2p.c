/*
 * nccl-net-rail: the verbs data path, receiver-driven.
 *
 * Receive number k uses CTS slot k % RAIL_IB_SLOTS and a QP set: QP
 * k % nqps, or every QP with NCCL_IB_SPLIT_DATA_ON_QPS=1.
 *
 * irecv(k, n buffers):
 *   1. one receive WR without SGE on every QP of the set (wr_id = request);
 *   2. n CTS entries {addr, size, rkey per member device, tag, n, idx,
 *      seq = k+1} in one RDMA WRITE (inline when it fits, signaled every
 *      16th per QP) into the sender's FIFO slot. No round trip is added:
 *      the CTS leaves as soon as the receive is posted.
 * isend(tag):
 *   the sender reads its FIFO slot (memory only: no syscall, no CQ),
 *   matches the tag to an entry (a send larger than the entry is an
 *   error); once every entry of the slot has its send, it posts, per QP of
 *   the set, the data RDMA WRITEs chained, the last one being an RDMA WRITE
 *   WITH IMMEDIATE, signaled, wr_id = the batch's lead request:
 *     n == 1: imm = size (the last data write carries it; an empty message
 *             or a QP without data gets a 0-byte write into the receiver's
 *             completion records);
 *     n  > 1: imm = MULTI|n, and the first QP of the set writes the n
 *             sizes into the receiver's completion record of the slot.
 * Completion: a request expects one CQE per QP of its set, counted per
 * member device (events[]); the receiver takes the size from imm or from
 * the completion record. RC ordering within a QP puts the data before the
 * immediate. CQs are polled 16 CQEs at a time from test().
 * A batch whose every write is inline (small host messages) completes at
 * post time: the data was copied into the work requests, so the buffer is
 * free; its CQE only retires send-queue slots (counted per QP, bounded by
 * RAIL_IB_EARLY_DEPTH). This takes the RC acknowledgement off the latency
 * path of small messages.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

#define SLOT_MASK ((uint64_t)RAIL_IB_SLOTS - 1)
#define CTS_SIGNAL_EVERY 16
#define CTS_DEPTH_LIMIT 120	/* below the QP's CTS_DEPTH send WRs */
#define SPLIT_ALIGN 128

/* wr_id of a signaled CTS write: bit 0 set, QP index, posted count. */
static uint64_t cts_wrid(int qpi, uint32_t posted)
{
	return 1 | ((uint64_t)qpi << 1) | ((uint64_t)posted << 16);
}

static void qp_set(const struct rail_ib_comm *c, uint64_t k, int *first, int *count)
{
	*first = c->split ? 0 : (int)(k % (uint64_t)c->nqps);
	*count = c->split ? c->nqps : 1;
}

static int post_send(struct rail_ib_comm *c, int qpi, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad = NULL;
	char where[160];
	int ret = rail_ibv.post_send(c->qps[qpi].qp, wr, &bad);

	if (rail_likely(!ret))
		return 0;
	ret = rail_verbs_err(ret);
	RAIL_WARN("ibv_post_send(%s) on %s failed: %s; the send queue is full or the QP is in "
		  "error", what, rail_ib_qp_where(c, qpi, where, sizeof(where)), RAIL_ERRSTR(-ret));
	c->error = -ret;
	return -ret;
}

/* ---- receive ------------------------------------------------------------ */

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

static void cts_fill(struct rail_ib_comm *c, uint64_t k, int n, void **data, const size_t *sizes,
		     const int *tags, void **mhandles, uint8_t *out)
{
	for (int i = 0; i < n; i++) {
		struct rail_ib_mh *mh = mhandles ? mhandles[i] : NULL;
		struct rail_ib_cts e;

		memset(&e, 0, sizeof(e));
		e.addr = (uintptr_t)data[i];
		e.size = sizes[i];
		for (int m = 0; mh && m < c->ndevs; m++)
			e.rkey[m] = mh->rkey[m];
		e.tag = tags ? tags[i] : 0;
		e.nreqs = n;
		e.idx = i;
		e.seq = k + 1;
		rail_ib_cts_encode(&e, out + (size_t)i * RAIL_IB_CTS_SIZE);
	}
}

static int post_recvs(struct rail_ib_comm *c, struct rail_ib_req *r, int first, int count)
{
	struct ibv_recv_wr wr = { .wr_id = (uintptr_t)r }, *bad = NULL;

	for (int j = 0; j < count; j++) {
		int qpi = first + j;
		char where[160];
		int ret = rail_ibv.post_recv(c->qps[qpi].qp, &wr, &bad);

		if (rail_unlikely(ret)) {
			ret = rail_verbs_err(ret);
			RAIL_WARN("ibv_post_recv on %s failed: %s", rail_ib_qp_where(c, qpi, where,
				  sizeof(where)), RAIL_ERRSTR(-ret));
			c->error = -ret;
			return -ret;
		}
		r->events[c->qps[qpi].member]++;
	}
	return 0;
}

static int post_cts(struct rail_ib_comm *c, int qpi, uint64_t k, int n, uint8_t *entries)
{
	struct rail_ib_qp *q = &c->qps[qpi];
	uint32_t len = (uint32_t)n * RAIL_IB_CTS_SIZE;
	uint64_t slot = k & SLOT_MASK;
	struct ibv_sge sge = {
		.addr = (uintptr_t)entries,
		.length = len,
		.lkey = c->res[q->member].scratch_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = len <= q->max_inline ? IBV_SEND_INLINE : 0,
	};

	wr.wr.rdma.remote_addr = c->remote_fifo_addr + slot * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	wr.wr.rdma.rkey = c->remote_fifo_rkey[q->remote_member];
	q->sq_posted++;
	if (q->sq_posted % CTS_SIGNAL_EVERY == 0) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		wr.wr_id = cts_wrid(qpi, q->sq_posted);
	}
	return post_send(c, qpi, &wr, "clear-to-send");
}

int rail_ib_irecv(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		  const size_t *sizes, const int *tags, void **mhandles)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	uint64_t k = c->seq, slot = k & SLOT_MASK;
	uint8_t *entries = c->cts_stage + slot * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	int first, count, err;

	err = rail_ib_comm_check(c, "irecv");
	if (err)
		return err;
	err = recv_check_args(c, n, sizes, mhandles);
	if (err)
		return err;
	qp_set(c, k, &first, &count);
	if (c->slot_busy[slot] || !cts_room(c, first)) {
		err = rail_ib_poll(c);
		if (err)
			return err;
		if (c->slot_busy[slot] || !cts_room(c, first))
			return rail_ib_peer_check(c, "irecv") ? c->error : -EAGAIN;
	}
	r->seq = k;
	for (int i = 0; i < n; i++) {
		r->sizes[i] = sizes[i];
		r->mhs[i] = mhandles ? mhandles[i] : NULL;
	}
	cts_fill(c, k, n, data, sizes, tags, mhandles, entries);
	err = post_recvs(c, r, first, count);
	if (!err)
		err = post_cts(c, first, k, n, entries);
	if (err)
		return err;
	c->slot_busy[slot] = r;
	c->seq++;
	return 0;
}

/* ---- send --------------------------------------------------------------- */

/* Load the CTS entries of slot k into the batch: 0, -EAGAIN or -EBADMSG. */
static int batch_load(struct rail_ib_comm *c, uint64_t k)
{
	struct rail_ib_batch *b = &c->batch;
	const uint8_t *slot = c->fifo + (k & SLOT_MASK) * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE;
	char why[200];
	int err;

	err = rail_ib_cts_decode(slot, k + 1, 0, &b->cts[0], why, sizeof(why));
	for (int i = 1; !err && i < b->cts[0].nreqs; i++)
		err = rail_ib_cts_decode(slot + (size_t)i * RAIL_IB_CTS_SIZE, k + 1, i, &b->cts[i],
					 why, sizeof(why));
	if (err == -EBADMSG) {
		RAIL_WARN("isend to peer %s: %s", c->peer, why);
		c->error = -EPROTO;
		return -EPROTO;
	}
	if (err)
		return err;
	b->nreqs = b->cts[0].nreqs;
	b->matched = 0;
	memset(b->reqs, 0, sizeof(b->reqs));
	return 0;
}

struct wr_list {
	int n;
	struct ibv_send_wr wr[RAIL_MAX_RECVS + 1];
	struct ibv_sge sge[RAIL_MAX_RECVS + 1];
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
	if (l->n > 0)
		l->wr[l->n - 1].next = wr;
	l->n++;
	return wr;
}

/* Piece j of count of a message split over the QP set: [*off, *off + *len). */
static void split_piece(size_t size, int j, int count, size_t *off, size_t *len)
{
	size_t chunk = RAIL_ALIGN_UP(RAIL_DIV_UP(size, (size_t)count), SPLIT_ALIGN);

	*off = RAIL_MIN((size_t)j * chunk, size);
	*len = RAIL_MIN(chunk, size - *off);
}

static void batch_data_wrs(struct rail_ib_comm *c, const struct rail_ib_qp *q, int j, int count,
			   struct wr_list *l)
{
	struct rail_ib_batch *b = &c->batch;

	for (int i = 0; i < b->nreqs; i++) {
		struct rail_ib_req *r = b->reqs[i];
		size_t off = 0, len = r->sizes[0];

		if (count > 1)
			split_piece(r->sizes[0], j, count, &off, &len);
		if (!len)
			continue;
		wr_add(l, (uintptr_t)r->data + off, (uint32_t)len, r->mh->lkey[q->member],
		       b->cts[i].addr + off, b->cts[i].rkey[q->remote_member], q->max_inline,
		       !r->mh->gpu);
	}
}

/* Every write of the batch can go inline (host memory, small): it completes at post time. */
static int batch_is_early(struct rail_ib_comm *c, int first, int count)
{
	struct rail_ib_batch *b = &c->batch;
	uint32_t inl = UINT32_MAX;

	for (int j = 0; j < count; j++)
		inl = RAIL_MIN(inl, c->qps[first + j].max_inline);
	if (b->nreqs > 1 && (uint32_t)b->nreqs * 4 > inl)
		return 0;
	for (int i = 0; i < b->nreqs; i++) {
		const struct rail_ib_req *r = b->reqs[i];

		if (r->sizes[0] && (r->mh->gpu || r->sizes[0] > inl))
			return 0;
	}
	return 1;
}

/* Room for an early batch of nwr WRs per QP; polls once if short. */
static int early_room(struct rail_ib_comm *c, int first, int count, int nwr)
{
	for (int pass = 0; pass < 2; pass++) {
		int ok = 1;

		for (int j = 0; j < count && ok; j++) {
			const struct rail_ib_qp *q = &c->qps[first + j];

			ok = q->sq_posted - q->sq_retired + (uint32_t)nwr <= RAIL_IB_EARLY_DEPTH;
		}
		if (ok)
			return 1;
		if (pass == 0 && rail_ib_poll(c))
			return 0;
	}
	return 0;
}

static int batch_post_qp(struct rail_ib_comm *c, int qpi, int j, int count, uint64_t k,
			 int early)
{
	struct rail_ib_batch *b = &c->batch;
	struct rail_ib_qp *q = &c->qps[qpi];
	struct rail_ib_req *lead = b->reqs[0];
	uint64_t slot = k & SLOT_MASK;
	uint64_t cmpl = c->remote_cmpl_addr + slot * RAIL_MAX_RECVS * 4;
	uint32_t cmpl_rkey = c->remote_cmpl_rkey[q->remote_member];
	struct ibv_send_wr *last;
	struct wr_list l;

	l.n = 0;
	batch_data_wrs(c, q, j, count, &l);
	if (b->nreqs > 1 && j == 0) {
		uint8_t *sz = c->sizes + slot * RAIL_MAX_RECVS * 4;

		last = wr_add(&l, (uintptr_t)sz, (uint32_t)b->nreqs * 4,
			      c->res[q->member].scratch_mr->lkey, cmpl, cmpl_rkey, q->max_inline, 1);
	} else if (b->nreqs > 1 || l.n == 0) {
		last = wr_add(&l, 0, 0, 0, cmpl, cmpl_rkey, 0, 0);
	} else {
		last = &l.wr[l.n - 1];
	}
	last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	last->imm_data = htonl(b->nreqs > 1 ? rail_ib_imm_multi(b->nreqs)
					    : rail_ib_imm_single(lead->sizes[0]));
	last->send_flags |= IBV_SEND_SIGNALED;
	if (early) {
		q->sq_posted += (uint32_t)l.n;
		last->wr_id = cts_wrid(qpi, q->sq_posted);
	} else {
		last->wr_id = (uintptr_t)lead;
		lead->events[q->member]++;
	}
	return post_send(c, qpi, &l.wr[0], "RDMA write");
}

static int batch_post(struct rail_ib_comm *c, uint64_t k)
{
	struct rail_ib_batch *b = &c->batch;
	struct rail_ib_req *lead = b->reqs[0];
	int first, count, early, err = 0;
	size_t sizes[RAIL_MAX_RECVS];

	lead->nmembers = b->nreqs;
	for (int i = 0; i < b->nreqs; i++) {
		lead->members[i] = b->reqs[i];
		b->reqs[i]->lead = lead;
		sizes[i] = b->reqs[i]->sizes[0];
	}
	if (b->nreqs > 1)
		rail_ib_sizes_encode(sizes, b->nreqs,
				     c->sizes + (k & SLOT_MASK) * RAIL_MAX_RECVS * 4);
	qp_set(c, k, &first, &count);
	early = batch_is_early(c, first, count);
	if (early && !early_room(c, first, count, b->nreqs + 1))
		early = 0;	/* no room: complete through the CQE instead */
	for (int j = 0; j < count && !err; j++)
		err = batch_post_qp(c, first + j, j, count, k, early);
	for (int i = 0; !err && early && i < b->nreqs; i++)
		b->reqs[i]->done = 1;
	return err;
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

	qp_set(c, c->seq, &first, &count);
	q = &c->qps[first];
	l.n = 0;
	wr_add(&l, 0, 0, 0, c->remote_cmpl_addr, c->remote_cmpl_rkey[q->remote_member], 0, 0);
	l.wr[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	l.wr[0].imm_data = htonl(rail_ib_imm_refused(idx, size));
	if (post_send(c, first, &l.wr[0], "refusal") == 0)
		c->error = -EMSGSIZE;
	return -EMSGSIZE;
}

static int send_match(struct rail_ib_comm *c, struct rail_ib_req *r, size_t size, int tag,
		      struct rail_ib_mh *mh)
{
	struct rail_ib_batch *b = &c->batch;

	for (int i = 0; i < b->nreqs; i++) {
		if (b->reqs[i] || b->cts[i].tag != tag)
			continue;
		if (size > b->cts[i].size) {
			RAIL_WARN("isend of %zu bytes (tag %d) to peer %s on %s: the receiver posted "
				  "only %llu bytes for it (receive %llu, buffer %d of %d); a send "
				  "larger than its receive is an error", size, tag, c->peer,
				  c->res[0].dev->name, (unsigned long long)b->cts[i].size,
				  (unsigned long long)c->seq, i, b->nreqs);
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
	return -EAGAIN;	/* a tag of a later receive: NCCL retries */
}

int rail_ib_isend(struct rail_comm *comm, struct rail_req *req, void *data, size_t size, int tag,
		  void *mhandle)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_mh *mh = mhandle;
	int err;

	err = rail_ib_comm_check(c, "isend");
	if (err)
		return err;
	if (rail_unlikely((size && !mh) || (mh && mh->magic != RAIL_IB_MH_MAGIC))) {
		RAIL_WARN("isend of %zu bytes to peer %s: no valid registration (mhandle %p)", size,
			  c->peer, mhandle);
		return -EINVAL;
	}
	if (c->batch.nreqs == 0) {
		err = batch_load(c, c->seq);
		if (err == -EAGAIN && rail_ib_peer_check(c, "isend"))
			return c->error;
		if (err)
			return err;
	}
	r->data = data;
	err = send_match(c, r, size, tag, mh);
	if (err || c->batch.matched < c->batch.nreqs)
		return err;
	err = batch_post(c, c->seq);
	if (err) {
		/* The requests already handed out fail in test(); this one is returned. */
		for (int i = 0; i < c->batch.nreqs; i++)
			c->batch.reqs[i]->error = err;
	}
	c->batch.nreqs = 0;
	c->seq++;
	return err;
}

/* ---- completions -------------------------------------------------------- */

static const char *wc_hint(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_RETRY_EXC_ERR:
		return "peer unreachable or dead; check the GID (NCCL_IB_GID_INDEX) and the link";
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return "the peer posted no receive in time; is it still running?";
	case IBV_WC_REM_ACCESS_ERR:
		return "the peer refused the access: buffer deregistered or freed on the peer?";
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return "a local buffer is not (or no longer) registered";
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_OP_ERR:
		return "the peer rejected the request (size beyond its buffer?)";
	case IBV_WC_WR_FLUSH_ERR:
		return "the QP went to error earlier";
	default:
		return "check dmesg and the link on both sides";
	}
}

static int wc_error(struct rail_ib_comm *c, int m, const struct ibv_wc *wc)
{
	const struct rail_ib_dev *d = c->res[m].dev;
	int err = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ||
			  wc->status == IBV_WC_REM_ACCESS_ERR || wc->status == IBV_WC_REM_OP_ERR ||
			  wc->status == IBV_WC_REM_INV_REQ_ERR
		  ? -EREMOTEIO : -EIO;

	if (!c->error || wc->status != IBV_WC_WR_FLUSH_ERR)
		RAIL_WARN("completion error on %s:%d qp 0x%x, connection to peer %s: %s (status "
			  "%d, vendor error 0x%x, opcode %d); %s", d->hca->name, d->port, wc->qp_num,
			  c->peer, rail_ibv_wc_status_str(wc->status), wc->status, wc->vendor_err,
			  wc->opcode, wc_hint(wc->status));
	if (!c->error)
		c->error = err;
	if (wc->wr_id && !(wc->wr_id & 1))
		((struct rail_ib_req *)(uintptr_t)wc->wr_id)->error = c->error;
	return c->error;
}

static int events_left(const struct rail_ib_req *r, int ndevs)
{
	for (int m = 0; m < ndevs; m++)
		if (r->events[m])
			return 1;
	return 0;
}

static int protocol_error(struct rail_ib_comm *c, int m, const char *what)
{
	RAIL_WARN("connection to peer %s on %s: protocol error: %s", c->peer,
		  c->res[m].dev->name, what);
	c->error = -EPROTO;
	return -EPROTO;
}

static int recv_done(struct rail_ib_comm *c, struct rail_ib_req *r, int m)
{
	uint64_t slot = r->seq & SLOT_MASK;
	int n = r->base.n;

	if (n > 1) {
		size_t got[RAIL_MAX_RECVS];

		rail_ib_sizes_decode(c->cmpl + slot * RAIL_MAX_RECVS * 4, n, got);
		for (int i = 0; i < n; i++) {
			if (got[i] > r->sizes[i]) {
				RAIL_WARN("receive %llu buffer %d from peer %s on %s: %zu bytes "
					  "arrived for a %zu-byte buffer", (unsigned long long)r->seq,
					  i, c->peer, c->res[m].dev->name, got[i], r->sizes[i]);
				return protocol_error(c, m, "completion record beyond the buffer");
			}
			r->sizes[i] = got[i];
		}
	}
	c->slot_busy[slot] = NULL;
	r->done = 1;
	return 0;
}

static int on_refusal(struct rail_ib_comm *c, struct rail_ib_req *r, int m, int idx,
		      uint64_t size)
{
	RAIL_WARN("receive %llu from peer %s on %s: the peer's message of %llu%s bytes does not "
		  "fit buffer %d of %zu bytes; the sender refused it (a send larger than its "
		  "receive is an error)", (unsigned long long)r->seq, c->peer, c->res[m].dev->name,
		  (unsigned long long)size, size == RAIL_IB_IMM_REFUSED_SIZE_MAX ? " or more" : "",
		  idx, idx < r->base.n ? r->sizes[idx] : 0);
	c->error = -EMSGSIZE;
	r->error = -EMSGSIZE;
	return -EMSGSIZE;
}

static int on_recv_cqe(struct rail_ib_comm *c, struct rail_ib_req *r, int m,
		       const struct ibv_wc *wc)
{
	uint64_t value;
	int kind = -EBADMSG, idx;

	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc->wc_flags & IBV_WC_WITH_IMM))
		kind = rail_ib_imm_decode(ntohl(wc->imm_data), &value, &idx);
	if (kind == RAIL_IB_IMM_REFUSAL)
		return on_refusal(c, r, m, idx, value);
	if (kind < 0 || (kind == RAIL_IB_IMM_COUNT) != (r->base.n > 1) ||
	    (kind == RAIL_IB_IMM_COUNT && (int)value != r->base.n) || !r->events[m])
		return protocol_error(c, m, "unexpected receive completion");
	if (kind == RAIL_IB_IMM_SIZE) {
		if (value > r->sizes[0]) {
			RAIL_WARN("receive %llu from peer %s on %s: %llu bytes arrived for a %zu-byte "
				  "buffer", (unsigned long long)r->seq, c->peer, c->res[m].dev->name,
				  (unsigned long long)value, r->sizes[0]);
			return protocol_error(c, m, "message beyond the posted buffer");
		}
		r->sizes[0] = value;
	}
	r->events[m]--;
	return events_left(r, c->ndevs) ? 0 : recv_done(c, r, m);
}

static int on_req_cqe(struct rail_ib_comm *c, struct rail_ib_req *r, int m,
		      const struct ibv_wc *wc)
{
	if (r->base.type == RAIL_REQ_RECV)
		return on_recv_cqe(c, r, m, wc);
	if (!r->events[m])
		return protocol_error(c, m, "completion for a finished request");
	r->events[m]--;
	if (events_left(r, c->ndevs))
		return 0;
	if (r->base.type == RAIL_REQ_SEND) {
		for (int i = 0; i < r->nmembers; i++)
			r->members[i]->done = 1;
	} else {
		r->done = 1;
	}
	return 0;
}

static int handle_wc(struct rail_ib_comm *c, int m, const struct ibv_wc *wc)
{
	if (rail_unlikely(wc->status != IBV_WC_SUCCESS))
		return wc_error(c, m, wc);
	c->res[m].cqes++;
	if (wc->wr_id & 1) {
		int qpi = (int)((wc->wr_id >> 1) & 0x7fff);

		if (qpi < c->nqps)
			c->qps[qpi].sq_retired = (uint32_t)(wc->wr_id >> 16);
		return 0;
	}
	return on_req_cqe(c, (struct rail_ib_req *)(uintptr_t)wc->wr_id, m, wc);
}

int rail_ib_poll(struct rail_ib_comm *c)
{
	struct ibv_wc wc[RAIL_IB_CQ_POLL];

	for (int m = 0; m < c->ndevs; m++) {
		int n;

		do {
			n = rail_ibv.poll_cq(c->res[m].cq, RAIL_IB_CQ_POLL, wc);
			if (rail_unlikely(n < 0)) {
				RAIL_WARN("ibv_poll_cq on %s for peer %s failed (%d)",
					  c->res[m].dev->name, c->peer, n);
				c->error = -EIO;
				return c->error;
			}
			for (int i = 0; i < n; i++) {
				int err = handle_wc(c, m, &wc[i]);

				if (err)
					return err;
			}
		} while (n == RAIL_IB_CQ_POLL);
	}
	return 0;
}

int rail_ib_peer_check(struct rail_ib_comm *c, const char *call)
{
	uint64_t now;
	ssize_t n;
	char b;

	if ((++c->idle & 255) != 0 || c->oob_fd < 0)
		return 0;
	now = rail_now_ns();
	if (now - c->oob_checked_ns < 100000000ull)
		return 0;
	c->oob_checked_ns = now;
	n = recv(c->oob_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
		return 0;
	RAIL_WARN("%s on %s: the connection to peer %s is gone (%s): the peer process exited or "
		  "crashed while this side still waits", call, c->res[0].dev->name, c->peer,
		  n == 0 ? "it closed its socket" : RAIL_ERRSTR(-errno));
	c->error = -ECONNRESET;
	return c->error;
}

int rail_ib_test(struct rail_req *req, int *done, size_t *sizes)
{
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_comm *c = (struct rail_ib_comm *)req->comm;
	int err;

	if (!r->done && !r->error) {
		err = rail_ib_comm_check(c, "test");
		if (!err)
			err = rail_ib_poll(c);
		if (err && !r->done)
			return err;
	}
	if (!r->done && !r->error)
		rail_ib_peer_check(c, "test");
	if (r->error || (!r->done && c->error))
		return r->error ? r->error : c->error;
	*done = r->done;
	if (r->done && req->type != RAIL_REQ_FLUSH) {
		for (int i = 0; i < req->n; i++)
			sizes[i] = r->sizes[i];
	}
	return 0;
}
