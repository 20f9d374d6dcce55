/*
 * nccl-net-rail: the verbs RMA backend's data path (rma_ib.h): requests,
 * post (a WRITE, a WRITE chained with a FETCH_AND_ADD, a READ), test and
 * progress over the context's CQ. NCCL's threads call in under the
 * context's lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rma/rma_ib.h"

#define REQS_FIRST 64

static uint64_t wrid(uint32_t idx, uint32_t stamp)
{
	return (uint64_t)idx << 32 | stamp;
}

static int req_get(struct rma_ib_ctx *x, uint32_t *idx)
{
	if (x->free_head == UINT32_MAX) {
		uint32_t n = x->nreqs ? 2 * x->nreqs : REQS_FIRST;
		struct rma_ib_req *v = realloc(x->reqs, (size_t)n * sizeof(*v));

		if (!v)
			return -ENOMEM;
		memset(v + x->nreqs, 0, (size_t)(n - x->nreqs) * sizeof(*v));
		for (uint32_t i = x->nreqs; i < n; i++)
			v[i].next = i + 1 < n ? i + 1 : UINT32_MAX;
		x->free_head = x->nreqs;
		x->reqs = v;
		x->nreqs = n;
	}
	*idx = x->free_head;
	x->free_head = x->reqs[*idx].next;
	return 0;
}

static void req_put(struct rma_ib_ctx *x, uint32_t idx)
{
	x->reqs[idx].state = RMA_IB_FREE;
	x->reqs[idx].next = x->free_head;
	x->free_head = idx;
}

void rma_ib_reqs_free(struct rma_ib_ctx *x)
{
	free(x->reqs);
	x->reqs = NULL;
	x->nreqs = 0;
	x->free_head = UINT32_MAX;
}

/* [off, off + len) of a window of size bytes, overflow-safe. */
static int inside(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

static int out_of_window(const struct rma_ib_ctx *x, const struct rail_rma_op *op,
			 const char *what, const struct rma_ib_mr *w, int rank, uint64_t off,
			 uint64_t len)
{
	RAIL_WARN("RMA %s (rank %d, context %d) to rank %d: %s [%llu, +%llu) is outside window "
		  "#%u of rank %d (%llu bytes) or not 8-byte aligned for a signal; nothing was "
		  "posted", op->call, x->coll->base.rank, op->context, op->peer, what,
		  (unsigned long long)off, (unsigned long long)len, w->base.index, rank,
		  (unsigned long long)w->peer_size[rank]);
	return -ERANGE;
}

/* Every range of op inside the windows every rank registered. */
static int op_check(const struct rma_ib_ctx *x, const struct rail_rma_op *op)
{
	const struct rma_ib_mr *l = (const struct rma_ib_mr *)op->local;
	const struct rma_ib_mr *r = (const struct rma_ib_mr *)op->remote;
	const struct rma_ib_mr *s = (const struct rma_ib_mr *)op->sig;
	int me = x->coll->base.rank;

	if (op->size && (!l || !r))
		return -EINVAL;
	if (op->size && !inside(op->local_off, op->size, l->peer_size[me]))
		return out_of_window(x, op, "the local range", l, me, op->local_off, op->size);
	if (op->size && !inside(op->remote_off, op->size, r->peer_size[op->peer]))
		return out_of_window(x, op, "the remote range", r, op->peer, op->remote_off,
				     op->size);
	if (s && ((op->sig_off & 7) || !inside(op->sig_off, 8, s->peer_size[op->peer])))
		return out_of_window(x, op, "the signal word", s, op->peer, op->sig_off, 8);
	return 0;
}

/* The WRs of op into wr[0..], chained, the last one signalled: how many. */
static int op_wrs(const struct rma_ib_ctx *x, const struct rail_rma_op *op, uint64_t id,
		  struct ibv_send_wr *wr, struct ibv_sge *sge)
{
	const struct rma_ib_mr *l = (const struct rma_ib_mr *)op->local;
	const struct rma_ib_mr *r = (const struct rma_ib_mr *)op->remote;
	const struct rma_ib_mr *s = (const struct rma_ib_mr *)op->sig;
	int n = 0;

	memset(wr, 0, 2 * sizeof(*wr));
	if (op->size || op->kind == RAIL_RMA_GET || !s) {
		wr[n].opcode = op->kind == RAIL_RMA_GET ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		if (op->size) {
			sge[n] = (struct ibv_sge){ .addr = (uintptr_t)(l->base.base + op->local_off),
						   .length = (uint32_t)op->size, .lkey = l->lkey };
			wr[n].sg_list = &sge[n];
			wr[n].num_sge = 1;
			wr[n].wr.rdma.remote_addr = r->peer_base[op->peer] + op->remote_off;
			wr[n].wr.rdma.rkey = r->peer_rkey[op->peer];
		}
		wr[n++].wr_id = id;
	}
	if (s && op->kind == RAIL_RMA_PUT) {
		sge[n] = (struct ibv_sge){ .addr = (uintptr_t)x->coll->scratch, .length = 8,
					   .lkey = x->coll->scratch_mr->lkey };
		wr[n].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr[n].sg_list = &sge[n];
		wr[n].num_sge = 1;
		wr[n].wr.atomic.remote_addr = s->peer_base[op->peer] + op->sig_off;
		wr[n].wr.atomic.compare_add = op->sig_add;
		wr[n].wr.atomic.rkey = s->peer_rkey[op->peer];
		wr[n++].wr_id = id;
	}
	if (n == 2)
		wr[0].next = &wr[1];
	wr[n - 1].send_flags = IBV_SEND_SIGNALED;
	return n;
}

/* Post n chained WRs as request i on QP qpi (lock held); the request is given back on failure. */
static int post_wrs(struct rma_ib_ctx *x, uint32_t i, int qpi, struct ibv_send_wr *wr, int n,
		    const struct rma_ib_req *what, uint32_t *idx, uint32_t *stamp)
{
	struct rma_ib_qp *q = &x->qps[qpi];
	struct ibv_send_wr *bad = NULL;
	int ret;

	if (q->inflight + n > RMA_IB_SQ_DEPTH) {
		RAIL_WARN("RMA %s (rank %d, context %d) to rank %d: %d work requests already in "
			  "flight on its QP (at most %d: NCCL keeps 32 operations in flight)",
			  what->call, x->coll->base.rank, what->context, what->peer, q->inflight,
			  RMA_IB_SQ_DEPTH);
		req_put(x, i);
		return -ENOBUFS;
	}
	ret = rail_ibv.post_send(q->qp, wr, &bad);
	if (ret) {
		ret = -rail_verbs_err(ret);
		RAIL_WARN("RMA %s (rank %d, context %d) to rank %d: ibv_post_send on qp 0x%x "
			  "failed: %s", what->call, x->coll->base.rank, what->context, what->peer,
			  q->qp->qp_num, RAIL_ERRSTR(ret));
		req_put(x, i);
		return ret;
	}
	x->reqs[i] = (struct rma_ib_req){ .stamp = x->reqs[i].stamp, .state = RMA_IB_WAIT,
					  .qpi = qpi, .nwr = n, .peer = what->peer,
					  .context = what->context, .call = what->call };
	q->inflight += n;
	*idx = i;
	*stamp = x->reqs[i].stamp;
	return 0;
}

/* The QP of (context, peer), ready to post on (lock held): 0 or why not. */
static int qp_ready(struct rma_ib_ctx *x, int qpi)
{
	const struct rma_ib_qp *q = &x->qps[qpi];

	if (!q->qp)
		return -EINVAL;	/* off the stride: the API checks it */
	if (q->failed)
		return atomic_load(&x->coll->err) ? atomic_load(&x->coll->err) : -EIO;
	return 0;
}

static int post_locked(struct rma_ib_ctx *x, const struct rail_rma_op *op, uint32_t *idx,
		       uint32_t *stamp)
{
	int qpi = op->context * x->coll->base.nranks + op->peer, n, ret;
	struct rma_ib_req what = { .peer = op->peer, .context = op->context, .call = op->call };
	struct ibv_send_wr wr[2];
	struct ibv_sge sge[2];
	uint32_t i;

	if ((ret = qp_ready(x, qpi)) || (ret = op_check(x, op)) || (ret = req_get(x, &i)))
		return ret;
	x->reqs[i].stamp = ++x->stamp;
	n = op_wrs(x, op, wrid(i, x->reqs[i].stamp), wr, sge);
	return post_wrs(x, i, qpi, wr, n, &what, idx, stamp);
}

int rma_ib_post(struct rail_rma_ctx *base, const struct rail_rma_op *op, uint32_t *idx,
		uint32_t *stamp)
{
	struct rma_ib_ctx *x = (struct rma_ib_ctx *)base;
	int err;

	pthread_mutex_lock(&x->lock);
	err = post_locked(x, op, idx, stamp);
	pthread_mutex_unlock(&x->lock);
	return err;
}

static int wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_REM_ACCESS_ERR: case IBV_WC_LOC_PROT_ERR: return -EACCES;
	case IBV_WC_RETRY_EXC_ERR: case IBV_WC_RNR_RETRY_EXC_ERR: return -ETIMEDOUT;
	case IBV_WC_WR_FLUSH_ERR: return -ECANCELED;
	default: return -EIO;
	}
}

static void wc_failed(struct rma_ib_ctx *x, struct rma_ib_req *r, const struct ibv_wc *wc)
{
	struct rma_ib_qp *q = &x->qps[r->qpi];
	int err = wc_errno(wc->status), first = 0;

	if (!q->failed && wc->status != IBV_WC_WR_FLUSH_ERR)
		RAIL_WARN("RMA %s (rank %d, context %d) to %s: completion error on qp 0x%x: %s "
			  "(vendor error 0x%x)%s; the RMA group fails (no failover for RMA)", r->call,
			  x->coll->base.rank, r->context, RMA_PEER(&x->coll->mesh, r->peer),
			  wc->qp_num, rail_ibv_wc_status_str(wc->status), wc->vendor_err,
			  err == -EACCES ? ": the peer refused the key or range (its window "
			  "deregistered, or an rkey not of it)" : "");
	q->failed = 1;
	atomic_compare_exchange_strong(&x->coll->err, &first, err);
	r->state = RMA_IB_FAILED;
	r->err = err;
}

static void wc_one(struct rma_ib_ctx *x, const struct ibv_wc *wc)
{
	uint32_t idx = (uint32_t)(wc->wr_id >> 32), stamp = (uint32_t)wc->wr_id;
	struct rma_ib_req *r = idx < x->nreqs ? &x->reqs[idx] : NULL;

	if (!r || r->stamp != stamp || r->state != RMA_IB_WAIT)
		return;	/* the second CQE of a request that failed already */
	x->qps[r->qpi].inflight -= r->nwr;
	if (wc->status == IBV_WC_SUCCESS)
		r->state = RMA_IB_DONE;
	else
		wc_failed(x, r, wc);
}

/* Drain the CQ (lock held). */
static int poll_locked(struct rma_ib_ctx *x)
{
	struct ibv_wc wc[RAIL_IB_CQ_POLL];
	int n;

	do {
		n = rail_ibv.poll_cq(x->cq, RAIL_IB_CQ_POLL, wc);
		if (n < 0) {
			RAIL_WARN("RMA (rank %d): ibv_poll_cq failed (%d)", x->coll->base.rank, n);
			return -EIO;
		}
		for (int i = 0; i < n; i++)
			wc_one(x, &wc[i]);
	} while (n == RAIL_IB_CQ_POLL);
	return 0;
}

int rma_ib_test(struct rail_rma_ctx *base, uint32_t idx, uint32_t stamp, int *done)
{
	struct rma_ib_ctx *x = (struct rma_ib_ctx *)base;
	struct rma_ib_req *r;
	int err;

	pthread_mutex_lock(&x->lock);
	err = poll_locked(x);
	r = idx < x->nreqs ? &x->reqs[idx] : NULL;
	if (!err && (!r || r->stamp != stamp || r->state == RMA_IB_FREE))
		err = -EINVAL;
	if (!err && r->state == RMA_IB_WAIT) {
		*done = 0;
	} else if (!err) {
		err = r->state == RMA_IB_FAILED ? r->err : 0;
		*done = !err;
		req_put(x, idx);
	}
	pthread_mutex_unlock(&x->lock);
	return err;
}

int rma_ib_progress(struct rail_rma_ctx *base)
{
	struct rma_ib_ctx *x = (struct rma_ib_ctx *)base;
	int err;

	pthread_mutex_lock(&x->lock);
	err = poll_locked(x);
	pthread_mutex_unlock(&x->lock);
	return err;
}

/*
 * Host memory: a get is done only once its completion came, and its bytes
 * are in host memory then: nothing to flush (1). A GPU window: a few bytes
 * of this rank's own copy read back over the rank's loopback QP of the
 * context (the net path's GDR flush, ib_flush.c): its completion comes
 * after every earlier NIC write into that GPU memory has landed, so the
 * GPU sees the data of every get completed before. The bytes land in the
 * scratch words, which nobody reads.
 */
int rma_ib_flush(struct rail_rma_ctx *base, int context, const struct rail_rma_mr *mr,
		 uint32_t *idx, uint32_t *stamp)
{
	struct rma_ib_ctx *x = (struct rma_ib_ctx *)base;
	const struct rma_ib_mr *w = (const struct rma_ib_mr *)mr;
	struct rma_ib_coll *c = x->coll;
	int me = c->base.rank, qpi = context * c->base.nranks + me, ret;
	struct rma_ib_req what = { .peer = me, .context = context, .call = "iflush" };
	struct ibv_sge sge = { .addr = (uintptr_t)(c->scratch + 1),
			       .length = (uint32_t)RAIL_MIN(mr->size, (size_t)8),
			       .lkey = c->scratch_mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_SIGNALED };
	uint32_t i;

	if (mr->type != RAIL_PTR_CUDA || !mr->size)
		return 1;
	wr.wr.rdma.remote_addr = (uintptr_t)mr->base;
	wr.wr.rdma.rkey = w->rkey;
	pthread_mutex_lock(&x->lock);
	ret = qp_ready(x, qpi);
	if (!ret)
		ret = req_get(x, &i);
	if (!ret) {
		x->reqs[i].stamp = ++x->stamp;
		wr.wr_id = wrid(i, x->reqs[i].stamp);
		ret = post_wrs(x, i, qpi, &wr, 1, &what, idx, stamp);
	}
	pthread_mutex_unlock(&x->lock);
	return ret;
}
