/*
 * nccl-net-rail: the verbs RMA backend's queue pairs (rma_ib.h): a CQ and
 * one RC QP per (context, peer on the stride) of a context, the QP numbers
 * exchanged over the mesh, every QP to RTS, then a barrier.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "rma/rma_ib.h"
#include "wire.h"

#define QP_REC_MAGIC 0x51414d52u	/* "RMAQ" */
#define QP_REC_HEAD 28

/* The record to one peer: this port, and this rank's QP toward it for each context. */
static size_t rec_len(int ncontexts)
{
	return QP_REC_HEAD + 4 * (size_t)ncontexts;
}

static void rec_encode(const struct rma_ib_ctx *x, int peer, uint8_t *p)
{
	const struct rma_ib_coll *c = x->coll;
	int n = c->base.nranks;

	memset(p, 0, rec_len(x->base.ncontexts));
	rail_put_u32(p, QP_REC_MAGIC);
	rail_put_u32(p + 4, (uint32_t)x->base.ncontexts);
	rail_put_u16(p + 8, c->dev->lid);
	p[10] = (uint8_t)c->dev->mtu;
	p[11] = (uint8_t)c->dev->link_layer;
	memcpy(p + 12, c->gid.raw, 16);
	for (int k = 0; k < x->base.ncontexts; k++) {
		const struct rma_ib_qp *q = &x->qps[k * n + peer];

		rail_put_u32(p + QP_REC_HEAD + 4 * k, q->qp ? q->qp->qp_num : 0);
	}
}

static struct ibv_qp *qp_create(struct rma_ib_ctx *x, int peer, int *err)
{
	struct rail_ib_dev *d = x->coll->dev;
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.qp_context = x;
	a.send_cq = a.recv_cq = x->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = RMA_IB_SQ_DEPTH;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	qp = rail_ibv.create_qp(d->hca->pd, &a);
	if (!qp) {
		*err = -(errno ? errno : EIO);
		RAIL_WARN("RMA createContext (rank %d): ibv_create_qp(RC) on %s:%d toward rank %d "
			  "failed: %s; the device may be out of QPs (max_qp %d)", x->coll->base.rank,
			  d->hca->name, d->port, peer, RAIL_ERRSTR(*err), d->hca->attr.max_qp);
	}
	return qp;
}

/* qp to INIT for WRITE, READ and atomics from any peer; a WARN names rank and peer. */
static int qp_init(struct rma_ib_ctx *x, struct ibv_qp *qp, int peer)
{
	char who[48], rank[24];

	snprintf(who, sizeof(who), "RMA createContext (rank %d): ", x->coll->base.rank);
	snprintf(rank, sizeof(rank), "rank %d", peer);
	return rail_ib_qp_to_init(qp, x->coll->dev, IBV_ACCESS_REMOTE_WRITE |
				  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, who, rank);
}

/* The address vector toward a peer's port, as the net path's (GRH on RoCE). */
static void fill_ah(const struct rma_ib_ctx *x, const uint8_t *rec, struct ibv_qp_attr *a)
{
	const struct rma_ib_coll *c = x->coll;
	int sl = (int)rail_param_int(RAIL_P_IB_SL), tc = (int)rail_param_int(RAIL_P_IB_TC);

	if (x->tc >= 0)
		tc = x->tc;
	a->ah_attr.port_num = (uint8_t)c->dev->port;
	a->ah_attr.sl = (uint8_t)(sl >= 0 ? sl : 0);
	a->ah_attr.dlid = rail_get_u16(rec + 8);
	if (c->dev->link_layer != IBV_LINK_LAYER_ETHERNET &&
	    !(c->dev->port_flags & IBV_QPF_GRH_REQUIRED))
		return;
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, rec + 12, 16);
	a->ah_attr.grh.sgid_index = (uint8_t)c->gid.index;
	a->ah_attr.grh.hop_limit = 255;
	a->ah_attr.grh.traffic_class = (uint8_t)(tc >= 0 ? tc : 0);
}

static int qp_rtr_rts(struct rma_ib_ctx *x, struct ibv_qp *qp, int peer, const uint8_t *rec,
		      uint32_t qpn)
{
	struct rail_ib_dev *d = x->coll->dev;
	struct rail_ib_mqp_call call = { .dev = d, .state = "RTR", .peer = "" };
	int rd = RAIL_MAX(1, RAIL_MIN(16, d->hca->attr.max_qp_rd_atom));
	struct ibv_qp_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)RAIL_MIN((int)d->mtu, (int)rec[10]);
	a.dest_qp_num = qpn;
	a.max_dest_rd_atomic = (uint8_t)rd;
	a.min_rnr_timer = 12;
	fill_ah(x, rec, &a);
	ret = rail_ib_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				IBV_QP_MIN_RNR_TIMER, &call);
	if (!ret) {
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = (uint8_t)rail_param_int(RAIL_P_IB_TIMEOUT);
		a.retry_cnt = (uint8_t)rail_param_int(RAIL_P_IB_RETRY_CNT);
		a.rnr_retry = 7;
		a.max_rd_atomic = (uint8_t)RAIL_MAX(1, RAIL_MIN(16, d->hca->attr.max_qp_init_rd_atom));
		call.state = "RTS";
		ret = rail_ib_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					IBV_QP_MAX_QP_RD_ATOMIC, &call);
	}
	if (ret)
		RAIL_WARN("RMA createContext (rank %d): ibv_modify_qp(%s) on %s:%d qp 0x%x toward "
			  "%s (its qp 0x%x) failed%s: %s; check NCCL_IB_GID_INDEX (chosen %d: %s), "
			  "the route between the ports and NCCL_IB_SL/NCCL_IB_TC", x->coll->base.rank,
			  call.state, d->hca->name, d->port, qp->qp_num,
			  RMA_PEER(&x->coll->mesh, peer), qpn, call.note, RAIL_ERRSTR(-ret),
			  x->coll->gid.index, x->coll->gid.reason);
	return -ret;
}

/* The peer's record: well formed, and for as many contexts as this call has. */
static int rec_check(const struct rma_ib_ctx *x, int peer, const uint8_t *rec)
{
	if (rail_get_u32(rec) == QP_REC_MAGIC &&
	    rail_get_u32(rec + 4) == (uint32_t)x->base.ncontexts)
		return 0;
	RAIL_WARN("RMA createContext (rank %d of %d): %s sent a malformed QP record (magic 0x%x, "
		  "%u contexts, this rank asked for %d): every rank must call createContext in the "
		  "same order with the same configuration", x->coll->base.rank, x->coll->base.nranks,
		  RMA_PEER(&x->coll->mesh, peer), rail_get_u32(rec), rail_get_u32(rec + 4),
		  x->base.ncontexts);
	return -EPROTO;
}

/* Every QP to RTS toward the peer's QP of the same context. */
static int qps_connect(struct rma_ib_ctx *x, const uint8_t *in)
{
	int n = x->coll->base.nranks, err = 0;
	size_t len = rec_len(x->base.ncontexts);

	for (int p = 0; !err && p < n; p++) {
		const uint8_t *rec = in + (size_t)p * len;

		if (((p - x->coll->base.rank + n) % n) % x->base.stride)
			continue;	/* off the stride */
		err = rec_check(x, p, rec);
		for (int k = 0; !err && k < x->base.ncontexts; k++)
			err = qp_rtr_rts(x, x->qps[k * n + p].qp, p, rec,
					 rail_get_u32(rec + QP_REC_HEAD + 4 * k));
	}
	return err;
}

static int qps_create(struct rma_ib_ctx *x)
{
	int n = x->coll->base.nranks, stride = x->base.stride, err = 0;

	for (int k = 0; k < x->base.ncontexts; k++) {
		for (int j = 0; j < n / stride; j++) {
			int p = (x->coll->base.rank + j * stride) % n;
			struct rma_ib_qp *q = &x->qps[k * n + p];

			q->qp = qp_create(x, p, &err);
			if (!q->qp)
				return err;
			if ((err = qp_init(x, q->qp, p)))
				return err;
		}
	}
	return 0;
}

static int cq_create(struct rma_ib_ctx *x)
{
	struct rail_ib_dev *d = x->coll->dev;
	int nqps = x->base.ncontexts * (x->coll->base.nranks / x->base.stride);
	int cqe = RAIL_MIN(nqps * RMA_IB_SQ_DEPTH + 16, d->hca->attr.max_cqe);

	x->cq = rail_ibv.create_cq(d->hca->ctx, cqe, x, NULL, 0);
	if (x->cq)
		return 0;
	RAIL_WARN("RMA createContext (rank %d): ibv_create_cq(%d entries) on %s:%d failed: %s",
		  x->coll->base.rank, cqe, d->hca->name, d->port, RAIL_ERRSTR(-errno));
	return -(errno ? errno : EIO);
}

/* All ranks agree that every QP is ready (or all fail): the status of each. */
static int all_ready(struct rma_ib_ctx *x, int err)
{
	struct rma_mesh *m = &x->coll->mesh;
	struct rma_record mine = { .status = err }, *all = calloc((size_t)m->nranks, sizeof(*all));
	int e = all ? rma_mesh_exchange(m, &mine, all, "createContext") : -ENOMEM;

	for (int q = 0; !e && !err && q < m->nranks; q++) {
		if (all[q].status) {
			RAIL_WARN("RMA createContext (rank %d of %d): %s could not ready its QPs (%s)",
				  m->rank, m->nranks, RMA_PEER(m, q), RAIL_ERRSTR(all[q].status));
			err = -ECONNABORTED;
		}
	}
	free(all);
	return err ? err : e;
}

int rma_ib_ctx_qps(struct rma_ib_ctx *x)
{
	int n = x->coll->base.nranks;
	size_t len = rec_len(x->base.ncontexts);
	uint8_t *out = calloc((size_t)n, len), *in = calloc((size_t)n, len);
	int err = out && in ? 0 : -ENOMEM;

	x->qps = calloc((size_t)(x->base.ncontexts * n), sizeof(*x->qps));
	if (!x->qps)
		err = -ENOMEM;
	if (!err)
		err = cq_create(x);
	if (!err)
		err = qps_create(x);
	/* The exchange happens even after a local failure, so that no rank waits for this one. */
	for (int p = 0; x->qps && p < n; p++)
		rec_encode(x, p, out + (size_t)p * len);
	if (out && in && x->qps) {
		int e = rma_mesh_alltoall(&x->coll->mesh, out, in, len, "createContext");

		err = err ? err : e;
	}
	if (!err)
		err = qps_connect(x, in);
	err = all_ready(x, err);
	free(out);
	free(in);
	return err;
}

void rma_ib_ctx_qps_free(struct rma_ib_ctx *x)
{
	int n = x->base.ncontexts * x->coll->base.nranks;

	for (int i = 0; x->qps && i < n; i++)
		if (x->qps[i].qp)
			rail_ibv.destroy_qp(x->qps[i].qp);
	free(x->qps);
	x->qps = NULL;
	if (x->cq)
		rail_ibv.destroy_cq(x->cq);
	x->cq = NULL;
}
