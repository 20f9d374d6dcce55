/*
 * nccl-net-rail: a comm's verbs resources: per member device a CQ and the
 * control regions (the sender's CTS FIFO and credit word, the receiver's
 * completion records, want word and eager ring; layouts in ib.h), and the
 * RC QPs through INIT, RTR and RTS; the checks at each data-path call
 * (rail_ib_comm_check), including the handles deregMr (ib_mr.c) left on
 * the comm's dead_mhs stack for the progress thread (rail_ib_mr_reap).
 *
 * QP i lives on local member i % ndevs and talks to remote member
 * i % remote_ndevs. Every WARN names the call, errno text, device:port, QP
 * number and peer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "zmem.h"

/* Receive queue depth: one WR per QP per unanswered CTS (<= RAIL_IB_SLOTS). */
/* answers to CTSes in flight; the order-safe eager ring's receives on QP 0 (ib_eager.c) */
#define RECV_DEPTH (RAIL_IB_SLOTS + 8 + RAIL_IB_EAGER_SLOTS + RAIL_IB_RING_RECV_BATCH)
/*
 * Sender SQ: at most one WR per in-flight send plus one per batch, per QP,
 * plus the WRs of batches completed early (all inline), which are bounded
 * separately (RAIL_IB_EARLY_DEPTH).
 */
#define SEND_DEPTH (2 * RAIL_MAX_REQUESTS * RAIL_MAX_RECVS + RAIL_IB_EARLY_DEPTH + 16)
#define CTS_DEPTH 128

const char *rail_ib_qp_where(struct rail_ib_comm *c, int qpi, char *buf, size_t len)
{
	const struct rail_ib_qp *q = &c->qps[qpi];
	const struct rail_ib_dev *d = c->res[q->member].dev;

	snprintf(buf, len, "%s:%d qp 0x%x to peer %s", d->hca->name, d->port,
		 q->qp ? q->qp->qp_num : 0, c->peer);
	return buf;
}

uint32_t rail_ib_qp_inline(const struct rail_ib_dev *d)
{
	if (!rail_param_int(RAIL_P_IB_USE_INLINE))
		return 0;
	return (uint32_t)RAIL_MIN(d->hca->max_inline, RAIL_IB_INLINE_MAX);
}

static struct ibv_mr *reg_ctrl(struct rail_ib_comm *c, int m, void *buf, size_t len,
			       int access, const char *what)
{
	struct rail_ib_dev *d = c->res[m].dev;
	struct ibv_mr *mr = rail_ibv.reg_mr(d->hca->pd, buf, len, access);

	if (!mr)
		RAIL_WARN("ibv_reg_mr(%s, %zu bytes) on %s:%d for a connection to peer %s failed: "
			  "%s; raise the locked-memory limit (ulimit -l)", what, len, d->hca->name,
			  d->port, c->peer, RAIL_ERRSTR(-errno));
	return mr;
}

static int alloc_ctrl(struct rail_ib_comm *c, int is_send)
{
	uint8_t **ctrl = is_send ? &c->fifo : &c->cmpl;
	uint8_t **scratch = is_send ? &c->sizes : &c->cts_stage;
	size_t ctrl_len = is_send ? RAIL_IB_SEND_CTRL_BYTES : RAIL_IB_RECV_CTRL_BYTES;
	size_t scratch_len = is_send ? RAIL_IB_SEND_SCRATCH_BYTES : RAIL_IB_RECV_SCRATCH_BYTES;

	/* zeroed pages, touched when used (or pinned by ibv_reg_mr): zmem.h */
	*ctrl = rail_zalloc(ctrl_len, 4096);
	*scratch = rail_zalloc(scratch_len, 4096);
	if (!*ctrl || !*scratch)
		return -ENOMEM;
	for (int m = 0; m < c->ndevs; m++) {
		struct rail_ib_devres *r = &c->res[m];

		r->ctrl_mr = reg_ctrl(c, m, *ctrl, ctrl_len,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
				      is_send ? "CTS FIFO" : "completion records and eager ring");
		if (!r->ctrl_mr)
			return -(errno ? errno : EIO);
		r->scratch_mr = reg_ctrl(c, m, *scratch, scratch_len, IBV_ACCESS_LOCAL_WRITE,
					 is_send ? "sizes and eager staging" : "CTS staging");
		if (!r->scratch_mr)
			return -(errno ? errno : EIO);
	}
	return 0;
}

/*
 * A new connection on member m: its port must be up, and its GID is
 * resolved now (a change since init is seen). The port's PORT_ERR count is
 * taken first, so a PORT_ERR from here on fails the comm at its next call.
 */
static int member_ready(struct rail_ib_comm *c, int m, const char *call)
{
	struct rail_ib_devres *r = &c->res[m];
	struct rail_ib_dev *d = r->dev;
	int err;

	r->port_gen = atomic_load(&d->port_downs);
	err = rail_ib_dev_port_up(d, call, c->peer);
	if (err)
		return err;
	if (rail_ib_dev_gid_resolve(d, &r->gid) == 0)
		return 0;
	RAIL_WARN("%s for peer %s on %s:%d: %s", call, c->peer, d->hca->name, d->port,
		  r->gid.reason);
	return -EADDRNOTAVAIL;
}

int rail_ib_comm_res_init(struct rail_ib_comm *c, int vdev, int is_send)
{
	const struct rail_ib_vdev *v = rail_ib_vdev_get(vdev);

	if (!v)
		return -EINVAL;
	c->vdev = vdev;
	c->ndevs = v->ndevs;
	/* NCCL (connect.cc): adaptive routing when every fused device has it. */
	c->ar = 1;
	c->ar_threshold = rail_param_int(RAIL_P_IB_AR_THRESHOLD) == RAIL_PARAM_AUTO
		? RAIL_IB_AR_THRESHOLD_AUTO : (uint64_t)rail_param_int(RAIL_P_IB_AR_THRESHOLD);
	for (int m = 0; m < v->ndevs; m++) {
		int err;

		c->res[m].dev = rail_ib_dev_get(v->devs[m]);
		atomic_store(&c->reg_dev[m], c->res[m].dev);
		c->ar = c->ar && c->res[m].dev->ar;
		err = member_ready(c, m, is_send ? "connect" : "accept");
		if (err)
			return err;
	}
	return alloc_ctrl(c, is_send);
}

static void destroy_qp(struct ibv_qp *qp)
{
	int ret = rail_ibv.destroy_qp(qp);

	if (ret)
		RAIL_WARN("ibv_destroy_qp(qp 0x%x) failed: %s", qp->qp_num,
			  RAIL_ERRSTR(-rail_verbs_err(ret)));
}

/*
 * A failed comm's QPs go to the error state before they are destroyed: that
 * flushes what is still queued at once. Otherwise a QP whose peer vanished
 * keeps retrying (forever on rxe at NCCL_IB_RETRY_CNT=7) and its destroy
 * waited about 50 s in the two-guest runs.
 */
static void qps_to_error(struct rail_ib_comm *c)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	for (int i = 0; i < c->nqps; i++)
		if (c->qps[i].qp)
			(void)rail_ibv.modify_qp(c->qps[i].qp, &a, IBV_QP_STATE);
}

/* A member's CQ and control-region registrations (its QPs go first). */
static void devres_release(struct rail_ib_devres *r)
{
	if (r->cq)
		rail_ibv.destroy_cq(r->cq);
	if (r->ctrl_mr)
		rail_ibv.dereg_mr(r->ctrl_mr);
	if (r->scratch_mr)
		rail_ibv.dereg_mr(r->scratch_mr);
	r->cq = NULL;
	r->ctrl_mr = r->scratch_mr = NULL;
}

void rail_ib_comm_res_fini(struct rail_ib_comm *c)
{
	if (c->error)
		qps_to_error(c);
	rail_ib_mr_dead_free(c);
	for (int i = 0; i < c->nqps; i++) {
		if (c->qps[i].qp)
			destroy_qp(c->qps[i].qp);
		c->qps[i].qp = NULL;
	}
	for (int m = 0; m < c->ndevs; m++)
		devres_release(&c->res[m]);
	rail_zfree(c->fifo, RAIL_IB_SEND_CTRL_BYTES);
	rail_zfree(c->sizes, RAIL_IB_SEND_SCRATCH_BYTES);
	rail_zfree(c->cmpl, RAIL_IB_RECV_CTRL_BYTES);
	rail_zfree(c->cts_stage, RAIL_IB_RECV_SCRATCH_BYTES);
	c->fifo = c->sizes = c->cmpl = c->cts_stage = NULL;
}

int rail_ib_qp_to_init(struct ibv_qp *qp, const struct rail_ib_dev *d, int access,
		       const char *who, const char *peer)
{
	struct rail_ib_mqp_call x = { .dev = d, .state = "INIT", .peer = peer };
	struct ibv_qp_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = (uint16_t)rail_param_int(RAIL_P_IB_PKEY);
	a.port_num = (uint8_t)d->port;
	a.qp_access_flags = (unsigned)access;
	ret = rail_ib_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				IBV_QP_ACCESS_FLAGS, &x);
	if (ret) {
		RAIL_WARN("%sibv_modify_qp(INIT) on %s:%d qp 0x%x to peer %s failed%s: %s; check "
			  "NCCL_IB_PKEY (index %d)", who, d->hca->name, d->port, qp->qp_num, peer,
			  x.note, RAIL_ERRSTR(-ret), a.pkey_index);
		return -ret;
	}
	return 0;
}

struct ibv_qp *rail_ib_qp_make(struct rail_ib_comm *c, struct rail_ib_dev *d, struct ibv_cq *cq,
			       int send_wr, int recv_wr, int access, int *err)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.qp_context = c;
	a.send_cq = a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = (uint32_t)send_wr;
	a.cap.max_recv_wr = (uint32_t)recv_wr;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = rail_ib_qp_inline(d);
	qp = rail_ibv.create_qp(d->hca->pd, &a);
	if (!qp) {
		*err = -(errno ? errno : EIO);
		RAIL_WARN("ibv_create_qp(RC, %d send + %d receive WRs) on %s:%d for a connection to "
			  "peer %s failed: %s; the device may be out of QPs or memory (max_qp %d)",
			  send_wr, recv_wr, d->hca->name, d->port, c->peer, RAIL_ERRSTR(*err),
			  d->hca->attr.max_qp);
		return NULL;
	}
	*err = rail_ib_qp_to_init(qp, d, access, "", c->peer);
	if (*err) {
		destroy_qp(qp);
		return NULL;
	}
	return qp;
}

struct ibv_qp *rail_ib_qp_new(struct rail_ib_comm *c, int m, int send_wr, int recv_wr,
			      int access, int *err)
{
	return rail_ib_qp_make(c, c->res[m].dev, c->res[m].cq, send_wr, recv_wr, access, err);
}

static int cq_create(struct rail_ib_comm *c, int m, int qps_on_member, int is_send)
{
	struct rail_ib_dev *d = c->res[m].dev;
	int per_qp = is_send ? SEND_DEPTH : RECV_DEPTH + CTS_DEPTH / 16 + 1;
	int cqe = per_qp * qps_on_member + (is_send ? 0 : RAIL_IB_LOOP_DEPTH) + 16;

	cqe = RAIL_MIN(cqe, d->hca->attr.max_cqe);
	c->res[m].cq = rail_ibv.create_cq(d->hca->ctx, cqe, c, NULL, 0);
	if (!c->res[m].cq) {
		int err = -(errno ? errno : EIO);

		RAIL_WARN("ibv_create_cq(%d entries) on %s:%d for a connection to peer %s failed: "
			  "%s", cqe, d->hca->name, d->port, c->peer, RAIL_ERRSTR(err));
		return err;
	}
	return 0;
}

int rail_ib_comm_qps_create(struct rail_ib_comm *c, int nqps, int is_send)
{
	int err = 0;

	for (int m = 0; m < c->ndevs; m++) {
		err = cq_create(c, m, RAIL_DIV_UP(nqps - m, c->ndevs), is_send);
		if (err)
			return err;
	}
	for (int i = 0; i < nqps; i++) {
		struct rail_ib_qp *q = &c->qps[i];

		q->member = i % c->ndevs;
		q->remote_member = i % c->remote_ndevs;
		q->qp = rail_ib_qp_new(c, q->member, is_send ? SEND_DEPTH : CTS_DEPTH,
				       is_send ? 1 : RECV_DEPTH, IBV_ACCESS_REMOTE_WRITE, &err);
		if (!q->qp)
			return err;
		c->nqps = i + 1;
		q->max_inline = rail_ib_qp_inline(c->res[q->member].dev);
	}
	/* The first CTS answered on QP i: the sets are blocks, taken in turn (rail_ib_qp_set). */
	for (int i = 0; i < nqps; i++)
		c->qps[i].ans_next = (uint64_t)(i / rail_ib_qps_per_msg(c));
	return 0;
}

/* The GID this comm resolved for its member d (rail_ib_comm_res_init). */
static const struct rail_ib_gid_choice *comm_gid(const struct rail_ib_comm *c,
						 const struct rail_ib_dev *d)
{
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].dev == d)
			return &c->res[m].gid;
	return &c->res[0].gid;	/* not reached: every QP is on a member */
}

static void fill_grh(struct ibv_qp_attr *a, const struct rail_ib_gid_choice *g,
		     const struct rail_ib_wire_dev *remote)
{
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, remote->gid, 16);
	a->ah_attr.grh.sgid_index = (uint8_t)g->index;
	a->ah_attr.grh.hop_limit = 255;
	a->ah_attr.grh.flow_label = 0;
}

/*
 * The RoCE traffic class of a QP (connect.cc): NCCL_IB_FIFO_TC, when set,
 * for the receiver's QPs, which carry only its writes to the sender (CTS
 * entries; ours also credit returns and want answers); the connection's
 * class (c->tc) for the sender's data QPs and the receiver's flush QP.
 */
static int rtr_tc(const struct rail_ib_comm *c, const struct rail_ib_dev *d, int flush)
{
	static atomic_int said;
	int fifo = (int)rail_param_int(RAIL_P_IB_FIFO_TC);

	if (c->base.kind != RAIL_COMM_RECV || flush || fifo < 0)
		return c->tc;
	if (d->link_layer != IBV_LINK_LAYER_ETHERNET && !atomic_exchange(&said, 1))
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL_IB_FIFO_TC=%d has no effect on %s:%d: "
			  "traffic classes are RoCE only, as in NCCL",
			  fifo, d->hca->name, d->port);
	return fifo;
}

/*
 * NCCL's address vector (connect.cc): RoCE always has a GRH with the
 * traffic class. InfiniBand routes by LID inside a subnet; a GRH is added
 * when the port requires one (IBV_QPF_GRH_REQUIRED) or the peer's GID is on
 * another subnet, and then the peer's FLID is the dlid (routed IB). The
 * service level is the connection's (NCCL_IB_SL, else the traffic class).
 */
static void fill_ah(struct rail_ib_comm *c, struct ibv_qp *qp, struct ibv_qp_attr *a,
		    const struct rail_ib_qp_path *path, const struct rail_ib_wire_dev *remote)
{
	const struct rail_ib_dev *d = path->dev;
	const struct rail_ib_gid_choice *g = path->gid;
	unsigned local_subnet = rail_ib_gid_subnet(g->raw);
	unsigned remote_subnet = rail_ib_gid_subnet(remote->gid);

	a->ah_attr.port_num = (uint8_t)d->port;
	a->ah_attr.sl = (uint8_t)c->sl;
	if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
		fill_grh(a, g, remote);
		a->ah_attr.grh.traffic_class = (uint8_t)path->tc;
		return;
	}
	a->ah_attr.dlid = remote->lid;
	if (local_subnet != remote_subnet) {
		unsigned flid = rail_ib_gid_flid(remote->gid);

		if (flid)
			a->ah_attr.dlid = (uint16_t)flid;
		else
			RAIL_WARN("ibv_modify_qp(RTR) on %s:%d qp 0x%x to peer %s: the peer's GID is "
				  "on subnet 0x%04x, this port's on 0x%04x, but it has no FLID; using "
				  "its LID %u, which routes only inside a subnet (check "
				  "NCCL_IB_ROUTABLE_FLID_GID_INDEX on both sides)", d->hca->name, d->port,
				  qp->qp_num, c->peer, remote_subnet, local_subnet, remote->lid);
		fill_grh(a, g, remote);
	} else if (d->port_flags & IBV_QPF_GRH_REQUIRED) {
		fill_grh(a, g, remote);
	}
}

/*
 * An RTR that times out on RoCE: the kernel found no way to the peer's
 * GID (no neighbour entry, no route), often a rail-only fabric where the
 * NICs of two rails do not reach each other.
 */
static void modify_warn_timeout(struct rail_ib_comm *c, struct ibv_qp *qp,
				const struct rail_ib_qp_path *path, const char *state,
				const char *note, const struct rail_ib_wire_dev *remote)
{
	const struct rail_ib_dev *d = path->dev;
	const struct rail_ib_gid_choice *lg = path->gid;
	char g[64], rg[64];

	rail_ib_gid_str(lg->raw, g, sizeof(g));
	rail_ib_gid_str(remote->gid, rg, sizeof(rg));
	RAIL_WARN("ibv_modify_qp(%s) on %s:%d qp 0x%x to peer %s (GID %s) failed%s: %s; the "
		  "kernel could not resolve the peer's address: check that GID %s reaches GID %s "
		  "(routes, neighbour/ARP entries, VLAN), NCCL_IB_GID_INDEX (chosen %d: %s), and, "
		  "where the NICs of different rails do not reach each other, NCCL_CROSS_NIC=0 "
		  "(each connection on one rail); NCCL_IB_MQP_RETRY_CNT and "
		  "NCCL_IB_MQP_RETRY_SLEEP_MSEC give a slow start-up longer", state, d->hca->name,
		  d->port, qp->qp_num, c->peer, rg, note, RAIL_ERRSTR(-ETIMEDOUT), g, rg, lg->index,
		  lg->reason);
}

static int modify_warn(struct rail_ib_comm *c, struct ibv_qp *qp, const struct rail_ib_qp_path *path,
		       const char *state, int err, const char *note,
		       const struct rail_ib_wire_dev *remote)
{
	const struct rail_ib_dev *d = path->dev;
	const struct rail_ib_gid_choice *lg = path->gid;
	char g[64], rg[64];

	if (path->quiet)
		return -err;
	if (d->link_layer == IBV_LINK_LAYER_ETHERNET && err == ETIMEDOUT)
		modify_warn_timeout(c, qp, path, state, note, remote);
	else if (d->link_layer == IBV_LINK_LAYER_ETHERNET)
		RAIL_WARN("ibv_modify_qp(%s) on %s:%d qp 0x%x to peer %s (GID %s) failed%s: %s; check "
			  "NCCL_IB_GID_INDEX (chosen %d %s: %s) and the route between the two GIDs",
			  state, d->hca->name, d->port, qp->qp_num, c->peer,
			  rail_ib_gid_str(remote->gid, rg, sizeof(rg)), note, RAIL_ERRSTR(-err),
			  lg->index, rail_ib_gid_str(lg->raw, g, sizeof(g)), lg->reason);
	else
		RAIL_WARN("ibv_modify_qp(%s) on %s:%d qp 0x%x to peer %s (LID %u) failed%s: %s; check "
			  "the subnet manager and NCCL_IB_SL", state, d->hca->name, d->port,
			  qp->qp_num, c->peer, remote->lid, note, RAIL_ERRSTR(-err));
	return -err;
}

int rail_ib_qp_connect(struct rail_ib_comm *c, struct ibv_qp *qp, const struct rail_ib_qp_path *p,
		       const struct rail_ib_wire_dev *remote, uint32_t remote_qpn)
{
	struct rail_ib_dev *d = p->dev;
	struct rail_ib_mqp_call x = { .dev = d, .state = "RTR", .peer = c->peer, .quiet = p->quiet };
	struct ibv_qp_attr a;
	uint64_t t0;
	int ret;

	/* max_dest_rd_atomic 1 serves the flush QP's reads and a probe's */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)RAIL_MIN((int)d->mtu, (int)remote->mtu);
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	fill_ah(c, qp, &a, p, remote);
	t0 = rail_now_ns();
	ret = rail_ib_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				IBV_QP_MIN_RNR_TIMER, &x);
	if (ret)
		return modify_warn(c, qp, p, "RTR", ret, x.note, remote);
	t0 = rail_now_ns() - t0;
	if (t0 > 100000000ull && x.attempts == 1)
		RAIL_INFO(RAIL_LOG_NET, "ibv_modify_qp(RTR) on %s:%d qp 0x%x to peer %s took %llu ms "
			  "(the kernel resolves the peer's address)", d->hca->name, d->port,
			  qp->qp_num, c->peer, (unsigned long long)(t0 / 1000000));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = (uint8_t)p->timeout;
	a.retry_cnt = (uint8_t)p->retry_cnt;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	x.state = "RTS";
	ret = rail_ib_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC, &x);
	if (ret)
		return modify_warn(c, qp, p, "RTS", ret, x.note, remote);
	return 0;
}

int rail_ib_qp_connect_to(struct rail_ib_comm *c, struct ibv_qp *qp, struct rail_ib_dev *d,
			  const struct rail_ib_wire_dev *remote, uint32_t remote_qpn, int flush)
{
	struct rail_ib_qp_path p = { d, comm_gid(c, d), rtr_tc(c, d, flush),
				     (int)rail_param_int(RAIL_P_IB_TIMEOUT),
				     (int)rail_param_int(RAIL_P_IB_RETRY_CNT), 0 };

	return rail_ib_qp_connect(c, qp, &p, remote, remote_qpn);
}

int rail_ib_qp_rtr_rts(struct rail_ib_comm *c, struct ibv_qp *qp, struct rail_ib_dev *d,
		       const struct rail_ib_wire_dev *remote, uint32_t remote_qpn, int flush)
{
	int err = rail_ib_qp_connect_to(c, qp, d, remote, remote_qpn, flush);

	if (!err)
		rail_flight_note(&c->base.fl, RAIL_FEV_STATE, qp->qp_num, IBV_QPS_RTS,
				 "QP ready to send (RTS)");
	return err;
}

/* ---- ECE (enhanced connection establishment), as NCCL (connect.cc) ----- */

static int ece_unsupported(int err)
{
	return err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS;
}

int rail_ib_comm_ece_query(struct rail_ib_comm *c, struct rail_ib_ece *out)
{
	int any = 0;

	memset(c->ece, 0, sizeof(c->ece));
	for (int m = 0; m < c->ndevs && m < c->nqps; m++) {
		struct ibv_ece e;
		int ret;

		if (!rail_param_int(RAIL_P_IB_ECE_ENABLE) || !rail_ibv.query_ece)
			break;
		memset(&e, 0, sizeof(e));
		ret = rail_ibv.query_ece(c->qps[m].qp, &e);
		if (ret) {
			ret = rail_verbs_err(ret);
			if (!ece_unsupported(ret))
				RAIL_INFO(RAIL_LOG_NET, "ibv_query_ece on %s:%d qp 0x%x failed: %s; "
					  "connection to peer %s goes without ECE",
					  c->res[m].dev->hca->name, c->res[m].dev->port,
					  c->qps[m].qp->qp_num, RAIL_ERRSTR(-ret), c->peer);
			continue;
		}
		c->ece[m] = (struct rail_ib_ece){ e.vendor_id, e.options, e.comp_mask };
		any |= e.vendor_id != 0;
	}
	if (out)
		memcpy(out, c->ece, sizeof(c->ece[0]) * (size_t)c->ndevs);
	return any ? c->ndevs : 0;
}

int rail_ib_qp_ece_set(struct rail_ib_comm *c, int i)
{
	struct rail_ib_qp *q = &c->qps[i];
	const struct rail_ib_ece *r = &c->remote_ece[q->remote_member];
	const struct rail_ib_dev *d = c->res[q->member].dev;
	struct ibv_ece e;
	int ret;

	if (!c->ece[q->member].vendor_id || !r->vendor_id || !rail_ibv.set_ece)
		return 0;
	memset(&e, 0, sizeof(e));
	e.vendor_id = r->vendor_id;
	e.options = r->options;
	e.comp_mask = r->comp_mask;
	ret = rail_ibv.set_ece(q->qp, &e);
	if (!ret)
		return 0;
	ret = rail_verbs_err(ret);
	if (ece_unsupported(ret))
		return 0;
	RAIL_WARN("ibv_set_ece(vendor 0x%x, options 0x%x) on %s:%d qp 0x%x to peer %s failed: %s; "
		  "set NCCL_IB_ECE_ENABLE=0 to connect without ECE", e.vendor_id, e.options,
		  d->hca->name, d->port, q->qp->qp_num, c->peer, RAIL_ERRSTR(-ret));
	return -ret;
}

int rail_ib_comm_qps_connect(struct rail_ib_comm *c, const uint32_t *remote_qpns)
{
	for (int i = 0; i < c->nqps; i++) {
		struct rail_ib_qp *q = &c->qps[i];
		int err;

		q->remote_qpn = remote_qpns[i];
		err = rail_ib_qp_ece_set(c, i);
		if (err)
			return err;
		err = rail_ib_qp_rtr_rts(c, q->qp, c->res[q->member].dev, &c->remote[q->remote_member],
					 q->remote_qpn, 0);
		if (err)
			return err;
	}
	return 0;
}

void rail_ib_local_wire_dev(const struct rail_ib_devres *r, uint32_t rkey,
			    struct rail_ib_wire_dev *out)
{
	const struct rail_ib_dev *d = r->dev;

	memset(out, 0, sizeof(*out));
	out->lid = d->lid;
	out->port = (uint8_t)d->port;
	out->link_layer = (uint8_t)d->link_layer;
	out->mtu = (uint8_t)d->mtu;
	out->gid_index = (uint8_t)r->gid.index;
	out->devnum = (uint16_t)(rail_ib_dev_num(d) + 1);
	out->ctrl_rkey = rkey;
	memcpy(out->gid, r->gid.raw, 16);
}

/* "n,m,...": device numbers, from 0. */
static void devnums_str(const int *nums, int n, char *out, size_t len)
{
	size_t off = 0;

	out[0] = '\0';
	for (int i = 0; i < n && off < len; i++) {
		int w = snprintf(out + off, len - off, "%s%d", i ? "," : "", nums[i]);

		off += w > 0 ? (size_t)w : 0;
	}
}

void rail_ib_rail_local_note(const struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	int mine[RAIL_MAX_VDEV_DEVS], theirs[RAIL_MAX_VDEV_DEVS], common = 0;
	char a[96], b[96];

	if (!rail_param_int(RAIL_P_IB_WARN_RAIL_LOCAL))
		return;
	for (int i = 0; i < c->ndevs; i++)
		mine[i] = rail_ib_dev_num(c->res[i].dev);
	for (int j = 0; j < m->ndevs; j++) {
		if (!m->devs[j].devnum)
			return;	/* a peer that does not say */
		theirs[j] = m->devs[j].devnum - 1;
		for (int i = 0; i < c->ndevs; i++)
			common += mine[i] == theirs[j];
	}
	if (common >= RAIL_MAX(c->ndevs, m->ndevs))
		return;
	devnums_str(mine, c->ndevs, a, sizeof(a));
	devnums_str(theirs, m->ndevs, b, sizeof(b));
	RAIL_INFO(RAIL_LOG_NET, "connection %s peer %s: not the same devices on both sides, "
		  "local (%s) and remote (%s): it leaves its rail (NCCL_IB_HCA's order and the "
		  "cabling decide; NCCL_IB_WARN_RAIL_LOCAL=0 silences this)",
		  c->base.kind == RAIL_COMM_SEND ? "to" : "from", c->peer, a, b);
}

/* ---- deregistered handles (deregMr in ib_mr.c pushes them on dead_mhs) ---- */

/* Progress thread: a request of this comm whose memory in mh the NIC may still read or write. */
static int mh_in_flight(struct rail_ib_comm *c, const struct rail_ib_mh *mh)
{
	for (uint32_t i = 0; i < c->base.reqs.capacity; i++) {
		const struct rail_ib_req *r = rail_pool_at(&c->base.reqs, i);

		if (r->base.magic != RAIL_REQ_MAGIC || r->done || r->error)
			continue;
		if (r->base.type == RAIL_REQ_SEND && r->mh == mh)
			return 1;
		for (int j = 0; r->base.type == RAIL_REQ_RECV && j < r->base.n; j++)
			if (r->mhs[j] == mh)
				return 1;
	}
	return 0;
}

int rail_ib_mr_reap(struct rail_ib_comm *c, const char *call)
{
	struct rail_ib_mh *mh = atomic_exchange_explicit(&c->dead_mhs, NULL, memory_order_acquire);
	char why[160];
	int busy = 0;

	while (mh) {
		struct rail_ib_mh *next = mh->dead_next;

		busy |= !c->error && mh_in_flight(c, mh);
		free(mh);
		mh = next;
	}
	if (!busy)
		return 0;
	/*
	 * Deregistering memory a request still uses (an abort): stop the
	 * connection, so that no message completes with whatever the memory
	 * holds next, and nothing lands in it through a registration shared
	 * with another handle.
	 */
	snprintf(why, sizeof(why), "%s after deregMr of a buffer a request in flight still uses "
		 "(deregister only buffers whose requests completed)", call);
	rail_ib_comm_quiesce(c, why);
	return c->error;
}

void rail_ib_mr_dead_free(struct rail_ib_comm *c)
{
	struct rail_ib_mh *mh = atomic_exchange(&c->dead_mhs, NULL);

	while (mh) {
		struct rail_ib_mh *next = mh->dead_next;

		free(mh);
		mh = next;
	}
}

/*
 * QP_FATAL on one of the comm's QPs (failover: the async thread leaves the
 * comm to move instead of failing it): 1 if that QP is one of its current
 * ones; an event on a QP a move already replaced is dropped.
 */
int rail_ib_qp_event_current(struct rail_ib_comm *c)
{
	unsigned qpn = atomic_load(&c->qp_event) - 1;

	for (int i = 0; i < c->nqps; i++)
		if (c->qps[i].qp && c->qps[i].qp->qp_num == qpn)
			return 1;
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].flush_qp && c->res[m].flush_qp->qp_num == qpn)
			return 1;
	atomic_store(&c->qp_event, 0);
	return 0;
}

/* 0, or the comm's error (logged once when it was first seen). */
int rail_ib_comm_check(struct rail_ib_comm *c, const char *call)
{
	int ev = atomic_load(&c->fatal);

	if (rail_unlikely(c->error))
		return c->error;
	if (rail_unlikely(c->mv || c->path_failed))
		return c->on_move(c, c->path_failed, call);
	if (rail_unlikely(atomic_load_explicit(&c->dead_mhs, memory_order_relaxed) != NULL)) {
		int err = rail_ib_mr_reap(c, call);

		if (err)
			return err;
	}
	if (rail_unlikely(atomic_load_explicit(&c->qp_event, memory_order_relaxed) != 0) &&
	    rail_ib_qp_event_current(c))
		return c->on_move(c, RAIL_IB_TRIG_QP, call);
	if (rail_unlikely(ev)) {
		RAIL_WARN("%s on a connection to peer %s: failed since async event %s", call,
			  c->peer, rail_ibv_event_str((enum ibv_event_type)(ev - 1)));
		c->error = -EIO;
		return c->error;
	}
	for (int m = 0; m < c->ndevs; m++) {
		const struct rail_ib_dev *d = c->res[m].dev;

		if (rail_unlikely(atomic_load(&d->hca->fatal))) {
			if (c->failover)
				return c->on_move(c, RAIL_IB_TRIG_FATAL, call);
			RAIL_WARN("%s on a connection to peer %s: device %s reported a fatal error",
				  call, c->peer, d->hca->name);
			c->error = -EIO;
			return c->error;
		}
		if (rail_unlikely(atomic_load_explicit(&d->port_downs, memory_order_relaxed) !=
				  c->res[m].port_gen)) {
			if (c->failover)
				return c->on_move(c, RAIL_IB_TRIG_PORT, call);
			RAIL_WARN("%s on a connection to peer %s: port %s:%d went down (async event "
				  "PORT_ERR) after the connection was made; the communicator fails. "
				  "Check the link (ibstat, ip link, the switch port); new connections "
				  "on the port work again once it is ACTIVE", call, c->peer,
				  d->hca->name, d->port);
			c->error = -ENETDOWN;
			return c->error;
		}
	}
	/*
	 * Moved away, or a probe of the way home due (ib_probe.c): now and then,
	 * whether home is back (and has stayed up), and the probe's steps.
	 */
	if (rail_unlikely(c->failover && (rail_ib_away(c) || c->back.due)) &&
	    (++c->back_tick & 255) == 0)
		return c->on_move(c, RAIL_IB_TRIG_BACK, call);
	return 0;
}

static void qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	rail_ibv.modify_qp(qp, &a, IBV_QP_STATE);
}

void rail_ib_comm_quiesce(struct rail_ib_comm *c, const char *why)
{
	RAIL_WARN("%s on a connection to peer %s (%s): stopping its QPs so the NIC no longer "
		  "touches the memory; requests in flight fail", why, c->peer, c->res[0].dev->name);
	for (int i = 0; i < c->nqps; i++)
		if (c->qps[i].qp)
			qp_to_error(c->qps[i].qp);
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].flush_qp)	/* loopback copies write receive buffers */
			qp_to_error(c->res[m].flush_qp);
	if (!c->error)
		c->error = -ECANCELED;
}

/* ---- a move to another path (ib_move.c) ------------------------------------ */

static void mark_post(struct rail_ib_comm *c, struct ibv_qp *qp, uint32_t a)
{
	struct ibv_send_wr swr = { .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_recv_wr rwr = { .wr_id = rail_ib_wrid(RAIL_IB_WR_MARK, a, 1) };
	struct ibv_send_wr *sbad = NULL;
	struct ibv_recv_wr *rbad = NULL;

	swr.wr_id = rail_ib_wrid(RAIL_IB_WR_MARK, a, 0);
	if (rail_ibv.post_send(qp, &swr, &sbad) == 0)
		c->marks_left++;
	if (rail_ibv.post_recv(qp, &rwr, &rbad) == 0) {
		c->marks_left++;
		c->rq_marks_left++;
	}
}

int rail_ib_comm_fence(struct rail_ib_comm *c)
{
	int posted = 0;

	c->fencing = 1;
	c->marks_left = c->rq_marks_left = 0;
	for (int i = 0; i < c->nqps; i++) {
		qp_to_error(c->qps[i].qp);
		mark_post(c, c->qps[i].qp, (uint32_t)i);
		posted += 2;
	}
	for (int m = 0; m < c->ndevs; m++) {
		if (!c->res[m].flush_qp)
			continue;
		qp_to_error(c->res[m].flush_qp);
		mark_post(c, c->res[m].flush_qp, RAIL_IB_MAX_QPS);
		posted += 2;
	}
	return posted - c->marks_left;	/* marks the provider refused: drain by time */
}

int rail_ib_comm_write_off(struct rail_ib_comm *c, unsigned dead)
{
	int n = 0;

	c->fencing = 1;
	c->marks_left = c->rq_marks_left = 0;
	for (int i = 0; i < c->nqps; i++)	/* a dead HCA's QPs are not touched */
		if (!(dead & (1u << c->qps[i].member)))
			qp_to_error(c->qps[i].qp);
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].flush_qp && !(dead & (1u << m)))
			qp_to_error(c->res[m].flush_qp);
	for (uint32_t i = 0; i < c->base.reqs.capacity; i++) {
		struct rail_ib_req *r = rail_pool_at(&c->base.reqs, i);
		int owed = 0;

		if (r->base.magic != RAIL_REQ_MAGIC || r->done || r->error)
			continue;
		for (int m = 0; m < c->ndevs; m++) {
			owed += r->events[m];
			r->events[m] = 0;
		}
		if (!owed)
			continue;
		n += owed;
		if (r->base.type == RAIL_REQ_FLUSH && !r->flushed && c->nreflush < RAIL_MAX_REQUESTS)
			c->reflush[c->nreflush++] = r;
		r->flushed = 1;
	}
	return n;
}

int rail_ib_member_rebuild(struct rail_ib_comm *c, int m, struct rail_ib_dev *d, int is_send,
			   struct rail_ib_old *old)
{
	struct rail_ib_devres *r = &c->res[m];
	int qps_on = 0, err;

	old->res[old->nres++] = *r;
	memset(r, 0, sizeof(*r));
	r->dev = d;
	atomic_store(&c->reg_dev[m], d);	/* regMr, on NCCL's other threads */
	/* registrations re-home where their keys are next read; after reg_dev (regMr) */
	atomic_store_explicit(&c->res_gen, atomic_load_explicit(&c->res_gen, memory_order_relaxed) + 1,
			      memory_order_release);
	err = member_ready(c, m, "move");
	if (err)
		return err;
	r->ctrl_mr = reg_ctrl(c, m, is_send ? c->fifo : c->cmpl,
			      is_send ? RAIL_IB_SEND_CTRL_BYTES : RAIL_IB_RECV_CTRL_BYTES,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			      is_send ? "CTS FIFO" : "completion records and eager ring");
	r->scratch_mr = r->ctrl_mr ? reg_ctrl(c, m, is_send ? c->sizes : c->cts_stage,
					      is_send ? RAIL_IB_SEND_SCRATCH_BYTES
						      : RAIL_IB_RECV_SCRATCH_BYTES,
					      IBV_ACCESS_LOCAL_WRITE,
					      is_send ? "sizes and eager staging" : "CTS staging")
				   : NULL;
	if (!r->scratch_mr)
		return -(errno ? errno : EIO);
	for (int i = 0; i < c->nqps; i++)
		qps_on += c->qps[i].member == m;
	err = cq_create(c, m, qps_on, is_send);
	for (int i = 0; !err && i < c->nqps; i++) {
		struct rail_ib_qp *q = &c->qps[i];

		if (q->member != m)
			continue;
		old->qps[old->nqps++] = q->qp;
		q->qp = rail_ib_qp_new(c, m, is_send ? SEND_DEPTH : CTS_DEPTH,
				       is_send ? 1 : RECV_DEPTH, IBV_ACCESS_REMOTE_WRITE, &err);
		q->sq_posted = q->sq_retired = q->sq_signaled = 0;
		q->max_inline = rail_ib_qp_inline(d);
	}
	return err;
}

void rail_ib_old_free(struct rail_ib_old *old)
{
	for (int i = 0; i < old->nqps; i++)
		if (old->qps[i])
			destroy_qp(old->qps[i]);
	for (int k = 0; k < old->nres; k++) {
		struct rail_ib_devres *r = &old->res[k];

		if (r->flush_qp)
			destroy_qp(r->flush_qp);
		if (r->flush_mr)
			rail_ibv.dereg_mr(r->flush_mr);
		devres_release(r);
	}
	old->nqps = old->nres = 0;
}
