/*
 * fakeverbs: the data path between QPs of one process. A work request is
 * carried out when it is posted: RDMA WRITE and READ copy with memcpy
 * between the registered ranges (checked against lkey, rkey -- each must
 * be of its QP's PD --, bounds and access rights), ATOMIC_FETCH_AND_ADD
 * adds to an aligned 8-byte word after the writes before it on its QP, WRITE_WITH_IMM and SEND take a posted receive of the
 * destination QP, and completions go to the CQs at once. Memory registered
 * through DMA-BUF has no host mapping here: its copies are skipped (the
 * request still completes). A destination QP in another process cannot be
 * reached: such requests complete with IBV_WC_RETRY_EXC_ERR (with retrying=yes,
 * as with a QP that is gone, they never complete). A device with
 * reorder=yes places RDMA WRITEs out of order (fv.h: FV_REORDER_TAIL).
 *
 * A send WR that cannot go now (a port not ACTIVE, fv_test_hold, earlier
 * WRs held) is held instead and carried out or failed later (fv_hold.c).
 * A destination QP in ERR drops packets: the WR completes with
 * IBV_WC_RETRY_EXC_ERR at once, as it always did, unless the sender's
 * device has retry_ms in its description: then it is held like one whose
 * port is down and fails after retry_ms. An error completion moves the QP
 * to ERR and flushes it (fv_qp_error); a WR posted on a QP in ERR, send or
 * receive, completes with IBV_WC_WR_FLUSH_ERR at once.
 *
 * Bytes land as a NIC's DMA does (dma_copy): in address order, in
 * release stores, so that the plugin's acquire loads of a polled word (a
 * CTS entry's sequence number, a trailer, the credit word) order what
 * came before it even when the fake runs in another thread than the
 * poller (the move thread), and ThreadSanitizer sees DMA, not a plain
 * memcpy racing with those loads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fv.h"

/* What a NIC's DMA does to dst: n bytes from src, in address order, each store a release. */
static void dma_copy(char *dst, const char *src, size_t n)
{
	size_t i = 0;

	if ((dst < src + n && src < dst + n) || !n) {
		memmove(dst, src, n);	/* overlapping: a loopback copy within one buffer */
		return;
	}
	for (; i < n && ((uintptr_t)(dst + i) & 7); i++)
		__atomic_store_n((uint8_t *)(dst + i), (uint8_t)src[i], __ATOMIC_RELEASE);
	for (; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, src + i, 8);
		__atomic_store_n((uint64_t *)(void *)(dst + i), w, __ATOMIC_RELEASE);
	}
	for (; i < n; i++)
		__atomic_store_n((uint8_t *)(dst + i), (uint8_t)src[i], __ATOMIC_RELEASE);
}

static const char *opname(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
	case IBV_WR_SEND: return "SEND";
	case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
	case IBV_WR_RDMA_READ: return "RDMA_READ";
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return "ATOMIC_FETCH_AND_ADD";
	default: return "OTHER";
	}
}

/* Host address of [iova, iova+len) in MR m, NULL if outside; *skip for DMA-BUF. */
static char *mr_addr(const struct fv_mr *m, uint64_t iova, uint64_t len, int *skip)
{
	if (iova < m->iova || iova + len > m->iova + m->mr.length)
		return NULL;
	*skip = m->dmabuf;
	return m->dmabuf ? (char *)1 : m->host + (iova - m->iova);
}

/*
 * Check the local SGEs and copy them, one after the other, to dst (NULL:
 * only check; skip_dst: the destination has no host mapping). Returns the
 * total length or -1.
 */
static long gather(const struct fv_qp *q, const struct ibv_send_wr *wr, char *dst, int skip_dst)
{
	uint64_t off = 0;

	for (int i = 0; i < wr->num_sge; i++) {
		const struct ibv_sge *s = &wr->sg_list[i];
		int skip = 0;
		char *p = (char *)(uintptr_t)s->addr;

		if (!(wr->send_flags & IBV_SEND_INLINE)) {
			struct fv_mr *m = fv_mr_by_key(s->lkey, 0);

			if (!m || m->mr.pd != q->qp.pd || !(p = mr_addr(m, s->addr, s->length, &skip)))
				return -1;
		}
		if (dst && !skip && !skip_dst)
			dma_copy(dst + off, p, s->length);
		off += s->length;
	}
	return (long)off;
}

/* The held-back parts of reordered writes, placed in the order they were written. */
struct held {
	char *dst;
	size_t len;
	int left;		/* entries into the provider before it lands */
	const void *mr;		/* the registration it writes through */
	uint32_t qpn;		/* the QP that wrote it */
	struct held *next;
	char data[];
};
static struct held *held_head;

/* Place every held part that qpn wrote (an atomic after them on that QP). */
static void place_held_of(uint32_t qpn)
{
	struct held **pp = &held_head;

	while (*pp) {
		struct held *h = *pp;

		if (h->qpn != qpn) {
			pp = &h->next;
			continue;
		}
		dma_copy(h->dst, h->data, h->len);
		*pp = h->next;
		free(h);
	}
}

void fv_place_held(const void *mr)
{
	struct held **pp = &held_head;

	while (*pp) {
		struct held *h = *pp;

		if (mr ? h->mr != mr : --h->left > 0) {
			pp = &h->next;
			continue;
		}
		dma_copy(h->dst, h->data, h->len);
		*pp = h->next;
		free(h);
	}
}

/*
 * Place the n bytes the SGEs of wr gather at p, reordered: the last tail
 * bytes now (the first, with the device's reorder_head), the rest held
 * back. 0, or -1 if out of memory.
 */
static int place_reordered(const struct fv_qp *q, const struct fv_dev *dev, const void *mr,
			   const struct ibv_send_wr *wr, char *p, long n, size_t tail)
{
	size_t now = dev->reorder_head ? (size_t)dev->reorder_head : tail;
	size_t off = dev->reorder_head ? 0 : (size_t)n - tail;	/* of the part placed now */
	struct held *h = malloc(sizeof(*h) + (size_t)n), **pp = &held_head;

	if (!h)
		return -1;
	gather(q, wr, h->data, 0);
	dma_copy(p + off, h->data + off, now);
	if (dev->reorder_head)
		memmove(h->data, h->data + now, (size_t)n - now);
	h->dst = p + (dev->reorder_head ? now : 0);
	h->len = (size_t)n - now;
	h->left = dev->reorder_delay ? dev->reorder_delay : 1;
	h->mr = mr;
	h->qpn = q->qp.qp_num;
	h->next = NULL;
	while (*pp)
		pp = &(*pp)->next;
	*pp = h;
	fv_log("reorder qpn=0x%x dest_qpn=0x%x len=%ld held=%zu", q->qp.qp_num, q->dest_qpn, n,
	       h->len);
	return 0;
}

static struct fv_recv *take_recv(struct fv_qp *d)
{
	struct fv_recv *r;

	if (!d->rcount)
		return NULL;
	r = &d->rq[d->rhead];
	d->rhead = (d->rhead + 1) % d->rcap;
	d->rcount--;
	return r;
}

/*
 * An 8-byte fetch-and-add at the responder, after every byte of the writes
 * posted before it on the QP (their held parts placed first): the old
 * value goes to the one local SGE. The remote address must be 8-byte
 * aligned and its MR allow REMOTE_ATOMIC; the device must do atomics.
 */
static enum ibv_wc_status fetch_add(struct fv_qp *q, struct fv_qp *d,
				    const struct ibv_send_wr *wr, uint32_t *len)
{
	const struct ibv_sge *s = wr->num_sge == 1 ? &wr->sg_list[0] : NULL;
	struct fv_mr *lm = s ? fv_mr_by_key(s->lkey, 0) : NULL;
	struct fv_mr *rm = fv_mr_by_key(wr->wr.atomic.rkey, 1);
	uint64_t old;
	char *dst, *p;
	int lskip = 0, skip = 0;

	if (!s || s->length != 8 || !lm || lm->mr.pd != q->qp.pd ||
	    !(dst = mr_addr(lm, s->addr, 8, &lskip)))
		return IBV_WC_LOC_PROT_ERR;
	if (!q->dev->atomic || !d->dev->atomic || (wr->wr.atomic.remote_addr & 7) || !rm ||
	    rm->mr.pd != d->qp.pd || !(rm->access & IBV_ACCESS_REMOTE_ATOMIC) ||
	    !(p = mr_addr(rm, wr->wr.atomic.remote_addr, 8, &skip)))
		return IBV_WC_REM_ACCESS_ERR;
	place_held_of(q->qp.qp_num);
	*len = 8;
	if (skip)
		return IBV_WC_SUCCESS;	/* DMA-BUF: no host mapping, nothing to add to */
	old = __atomic_fetch_add((uint64_t *)(void *)p, wr->wr.atomic.compare_add,
				 __ATOMIC_ACQ_REL);
	if (!lskip)
		dma_copy(dst, (const char *)&old, 8);
	return IBV_WC_SUCCESS;
}

/* Carry out one WR; returns the sender's completion status. */
static enum ibv_wc_status execute(struct fv_qp *q, const struct ibv_send_wr *wr, uint32_t *len)
{
	struct fv_qp *d = fv_qp_by_num(q->dest_qpn);
	enum ibv_wr_opcode op = wr->opcode;
	struct fv_mr *rm = NULL;
	long n = 0;
	int skip = 0;
	char *p = NULL;

	if (!d || d->state < IBV_QPS_RTR || d->state == IBV_QPS_ERR)
		return IBV_WC_RETRY_EXC_ERR;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD)
		return fetch_add(q, d, wr, len);
	if (op == IBV_WR_RDMA_READ) {
		struct fv_mr *lm = wr->num_sge == 1 ? fv_mr_by_key(wr->sg_list[0].lkey, 0) : NULL;
		char *dst;
		int lskip = 0;

		rm = fv_mr_by_key(wr->wr.rdma.rkey, 1);
		if (!lm || !(dst = mr_addr(lm, wr->sg_list[0].addr, wr->sg_list[0].length, &lskip)))
			return IBV_WC_LOC_PROT_ERR;
		if (!rm || rm->mr.pd != d->qp.pd || !(rm->access & IBV_ACCESS_REMOTE_READ) ||
		    !(p = mr_addr(rm, wr->wr.rdma.remote_addr, wr->sg_list[0].length, &skip)))
			return IBV_WC_REM_ACCESS_ERR;
		if (!skip && !lskip)
			dma_copy(dst, p, wr->sg_list[0].length);
		*len = wr->sg_list[0].length;
		return IBV_WC_SUCCESS;
	}
	n = gather(q, wr, NULL, 0);
	if (n < 0)
		return IBV_WC_LOC_PROT_ERR;
	*len = (uint32_t)n;
	if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
		size_t tail = d->dev->reorder_head   ? (size_t)d->dev->reorder_head
			      : d->dev->reorder_tail ? (size_t)d->dev->reorder_tail
						     : FV_REORDER_TAIL;

		rm = fv_mr_by_key(wr->wr.rdma.rkey, 1);
		if (n && (!rm || rm->mr.pd != d->qp.pd || !(rm->access & IBV_ACCESS_REMOTE_WRITE) ||
			  !(p = mr_addr(rm, wr->wr.rdma.remote_addr, (uint64_t)n, &skip))))
			return IBV_WC_REM_ACCESS_ERR;
		if ((size_t)n > tail && d->dev->reorder && !skip) {
			if (place_reordered(q, d->dev, &rm->mr, wr, p, n, tail))
				return IBV_WC_LOC_LEN_ERR;
		} else if (n) {
			gather(q, wr, p, skip);
		}
	}
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) {
		struct fv_recv *r = take_recv(d);
		struct ibv_wc wc;

		if (!r)
			return IBV_WC_RNR_RETRY_EXC_ERR;
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = r->wr_id;
		wc.status = IBV_WC_SUCCESS;
		wc.qp_num = d->qp.qp_num;
		wc.src_qp = q->qp.qp_num;
		wc.byte_len = (uint32_t)n;
		wc.opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		if (op != IBV_WR_SEND) {
			wc.wc_flags = IBV_WC_WITH_IMM;
			wc.imm_data = wr->imm_data;
		}
		if (op != IBV_WR_RDMA_WRITE_WITH_IMM && n) {
			struct fv_mr *m = fv_mr_by_key(r->lkey, 0);

			if (!m || (uint32_t)n > r->len || !(p = mr_addr(m, r->addr, (uint64_t)n, &skip)))
				return IBV_WC_REM_ACCESS_ERR;
			gather(q, wr, p, skip);
		}
		fv_cq_push((struct fv_cq *)(void *)d->qp.recv_cq, &wc);
	}
	return IBV_WC_SUCCESS;
}

enum ibv_wc_opcode fv_wc_op(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
	case IBV_WR_SEND: case IBV_WR_SEND_WITH_IMM: return IBV_WC_SEND;
	default: return IBV_WC_RDMA_WRITE;
	}
}

static void log_wr(const struct fv_qp *q, const struct ibv_send_wr *wr)
{
	uint64_t len = 0;

	for (int i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	fv_log("ibv_post_send dev=%s qpn=0x%x wr_id=0x%llx opcode=%s send_flags=0x%x num_sge=%d "
	       "len=%llu lkey=0x%x remote_addr=0x%llx rkey=0x%x imm=0x%x", q->dev->ibdev.name,
	       q->qp.qp_num, (unsigned long long)wr->wr_id, opname(wr->opcode), wr->send_flags,
	       wr->num_sge, (unsigned long long)len, wr->num_sge ? wr->sg_list[0].lkey : 0,
	       (unsigned long long)wr->wr.rdma.remote_addr, wr->wr.rdma.rkey,
	       wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM
		       ? wr->imm_data : 0);
}

void fv_send_complete(struct fv_qp *q, uint64_t wr_id, enum ibv_wr_opcode op, int signaled,
		      enum ibv_wc_status st, uint32_t len)
{
	struct ibv_wc wc;

	if (st != IBV_WC_SUCCESS)
		fv_log("wc qpn=0x%x wr_id=0x%llx status=%d", q->qp.qp_num,
		       (unsigned long long)wr_id, (int)st);
	else if (!signaled && !q->sq_sig_all)
		return;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = fv_wc_op(op);
	wc.qp_num = q->qp.qp_num;
	wc.byte_len = len;
	fv_cq_push((struct fv_cq *)(void *)q->qp.send_cq, &wc);
}

/*
 * A request of len bytes went through: it took one PSN per path-MTU packet
 * (at least one) on the sender's send queue and on its destination's
 * receive queue, as ibv_query_qp then tells (sq_psn, rq_psn).
 */
static void psn_advance(struct fv_qp *q, uint32_t len)
{
	struct fv_qp *d = fv_qp_by_num(q->dest_qpn);
	uint32_t mtu = q->path_mtu >= IBV_MTU_256 && q->path_mtu <= IBV_MTU_4096
			       ? 128u << q->path_mtu : 4096u;
	uint32_t n = len ? (len + mtu - 1) / mtu : 1;

	q->sq_psn = (q->sq_psn + n) & FV_PSN_MASK;
	if (d)
		d->rq_psn = (d->rq_psn + n) & FV_PSN_MASK;
}

void fv_send_run(struct fv_qp *q, const struct ibv_send_wr *wr)
{
	uint32_t len = 0;
	enum ibv_wc_status st = execute(q, wr, &len);

	/* retrying=yes: real hardware retries for seconds before it gives up */
	if (st == IBV_WC_RETRY_EXC_ERR && q->dev->retrying) {
		fv_log("wc qpn=0x%x wr_id=0x%llx held: the destination is gone, retrying",
		       q->qp.qp_num, (unsigned long long)wr->wr_id);
		return;
	}
	if (st == IBV_WC_SUCCESS)
		psn_advance(q, len);
	fv_send_complete(q, wr->wr_id, wr->opcode, (wr->send_flags & IBV_SEND_SIGNALED) != 0, st,
			 len);
	if (st != IBV_WC_SUCCESS)
		fv_qp_error(q);	/* after its own completion: then the flushes */
}

int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;

	pthread_mutex_lock(&fv_lock);
	fv_progress();
	for (; wr; wr = wr->next) {
		const char *why;

		log_wr(q, wr);
		if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR) {
			fv_log("ibv_post_send qpn=0x%x ret=EINVAL why=\"QP not in RTS\"", qp->qp_num);
			*bad = wr;
			pthread_mutex_unlock(&fv_lock);
			return EINVAL;
		}
		if (q->state == IBV_QPS_ERR) {
			if (!q->dev->dead)	/* a dead HCA completes nothing */
				fv_send_complete(q, wr->wr_id, wr->opcode, 1, IBV_WC_WR_FLUSH_ERR, 0);
			continue;
		}
		why = fv_hold_why(q);
		if (!why) {
			fv_send_run(q, wr);
			continue;
		}
		if (fv_hold_push(q, wr, why)) {
			fv_log("ibv_post_send qpn=0x%x ret=ENOMEM why=\"no memory to hold the WR\"",
			       qp->qp_num);
			*bad = wr;
			pthread_mutex_unlock(&fv_lock);
			return ENOMEM;
		}
	}
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;

	pthread_mutex_lock(&fv_lock);
	fv_progress();
	for (; wr; wr = wr->next) {
		struct fv_recv *r;

		fv_log("ibv_post_recv dev=%s qpn=0x%x wr_id=0x%llx num_sge=%d", q->dev->ibdev.name,
		       qp->qp_num, (unsigned long long)wr->wr_id, wr->num_sge);
		if (q->state == IBV_QPS_ERR) {	/* as hardware: flushed at once */
			if (!q->dev->dead)
				fv_flush_one(q, 1, wr->wr_id, IBV_WC_RECV);
			continue;
		}
		if (q->rcount == q->rcap - 1 || q->state == IBV_QPS_RESET) {
			*bad = wr;
			pthread_mutex_unlock(&fv_lock);
			return ENOMEM;
		}
		r = &q->rq[(q->rhead + q->rcount++) % q->rcap];
		memset(r, 0, sizeof(*r));
		r->wr_id = wr->wr_id;
		r->nsge = wr->num_sge;
		if (wr->num_sge) {
			r->addr = wr->sg_list[0].addr;
			r->len = wr->sg_list[0].length;
			r->lkey = wr->sg_list[0].lkey;
		}
	}
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

int fv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fv_cq *c = (struct fv_cq *)(void *)cq;
	int got = 0;

	pthread_mutex_lock(&fv_lock);
	fv_progress();	/* a completion comes after the whole message; held WRs go or fail */
	while (got < n && c->count) {
		wc[got++] = c->wcs[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
	}
	pthread_mutex_unlock(&fv_lock);
	return got;
}
