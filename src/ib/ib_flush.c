/*
 * nccl-net-rail: the GDR flush. After the NIC wrote GPU memory, NCCL may
 * ask for a flush so that the GPU sees the data: a 1-byte RDMA READ of the
 * last written buffer, on a QP connected to itself, on every member
 * device; its completion means every earlier write on that PCIe path has
 * landed. Flush QPs exist on receive comms when a member device can
 * reach GPU memory (DMA-BUF or peermem) and NCCL_GDR_FLUSH_DISABLE=0, or
 * with NCCL_RAIL_IB_FLUSH_HOST=1 (testing on hosts without GPUs).
 *
 * The same self-connected QP copies an eager message from the ring into a
 * GPU buffer (an RDMA WRITE to itself, ib_eager.c): the CPU cannot. A
 * receive comm that may see GPU buffers but has no such QP offers no eager
 * ring (rail_ib_eager_possible).
 */
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

/* Whether a member device can register GPU memory (its ladder reached DMA-BUF or peermem). */
static int comm_may_see_gpu(const struct rail_ib_comm *c)
{
	for (int m = 0; m < c->ndevs; m++) {
		const struct rail_ib_ladder *l = &c->res[m].dev->hca->ladder;

		if (l->dmabuf || l->peermem)
			return 1;
	}
	return 0;
}

static int flush_wanted(struct rail_ib_comm *c)
{
	if (rail_param_int(RAIL_P_GDR_FLUSH_DISABLE))
		return 0;
	if (rail_param_int(RAIL_P_IB_FLUSH_HOST))
		return 1;
	return comm_may_see_gpu(c);
}

static int flush_member(struct rail_ib_comm *c, int m)
{
	struct rail_ib_devres *r = &c->res[m];
	struct rail_ib_wire_dev self;
	int err;

	r->flush_mr = rail_ibv.reg_mr(r->dev->hca->pd, c->flush_buf, sizeof(c->flush_buf),
				      IBV_ACCESS_LOCAL_WRITE);
	if (!r->flush_mr) {
		err = -(errno ? errno : EIO);
		RAIL_WARN("ibv_reg_mr(flush target) on %s:%d for a connection to peer %s failed: %s",
			  r->dev->hca->name, r->dev->port, c->peer, RAIL_ERRSTR(err));
		return err;
	}
	r->flush_qp = rail_ib_qp_new(c, m, RAIL_IB_LOOP_DEPTH, 1,
				     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, &err);
	if (!r->flush_qp)
		return err;
	rail_ib_local_wire_dev(r, 0, &self);
	return rail_ib_qp_rtr_rts(c, r->flush_qp, r->dev, &self, r->flush_qp->qp_num, 1);
}

int rail_ib_flush_init(struct rail_ib_comm *c)
{
	if (!flush_wanted(c))
		return 0;
	c->flush = 1;
	c->flush_host = (uint32_t)rail_param_int(RAIL_P_IB_FLUSH_HOST);
	for (int m = 0; m < c->ndevs; m++) {
		int err = flush_member(c, m);

		if (err)
			return err;
	}
	return 0;
}

/*
 * Whether this receive comm may offer an eager ring: its buffers are host
 * memory, or a self-connected QP can copy into GPU memory; and the user
 * did not turn it off (NCCL_RAIL_IB_EAGER=0).
 */
int rail_ib_eager_possible(struct rail_ib_comm *c)
{
	if (!rail_param_int(RAIL_P_IB_EAGER))
		return 0;
	if (c->flush)
		return 1;
	if (rail_param_int(RAIL_P_IB_FLUSH_HOST))
		return 0;
	return !comm_may_see_gpu(c);
}

int rail_ib_loop_post(struct rail_ib_comm *c, int m, struct ibv_send_wr *wr, const char *what)
{
	struct rail_ib_devres *res = &c->res[m];
	struct ibv_send_wr *bad = NULL;
	int ret = rail_ibv.post_send(res->flush_qp, wr, &bad);

	if (rail_likely(!ret))
		return 0;
	ret = rail_verbs_err(ret);
	RAIL_WARN("ibv_post_send(%s) on %s:%d qp 0x%x (connection to peer %s) failed: %s", what,
		  res->dev->hca->name, res->dev->port, res->flush_qp->qp_num, c->peer,
		  RAIL_ERRSTR(-ret));
	c->error = -ret;
	return -ret;
}

void rail_ib_flush_fini(struct rail_ib_comm *c)
{
	for (int m = 0; m < c->ndevs; m++) {
		struct rail_ib_devres *r = &c->res[m];

		if (r->flush_qp)
			rail_ibv.destroy_qp(r->flush_qp);
		if (r->flush_mr)
			rail_ibv.dereg_mr(r->flush_mr);
		r->flush_qp = NULL;
		r->flush_mr = NULL;
	}
}

static int flush_post(struct rail_ib_comm *c, struct rail_ib_req *r);

int rail_ib_iflush(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		   const int *sizes, void **mhandles)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_req *r = (struct rail_ib_req *)req;
	struct rail_ib_mh *mh = NULL;
	int last = -1, err;

	if (!c->flush)
		return 1;
	for (int i = 0; i < n; i++) {
		struct rail_ib_mh *h = mhandles ? mhandles[i] : NULL;

		if (sizes && sizes[i] > 0 && h && h->magic == RAIL_IB_MH_MAGIC && h->gpu) {
			last = i;
			mh = h;
		}
	}
	if (last < 0)
		return 1;
	err = rail_ib_comm_check(c, "iflush");
	if (err == -EAGAIN && c->mv && c->nreflush < RAIL_MAX_REQUESTS) {
		/* the comm is moving: posted on the new device once the move is done */
		r->bufs[0] = data[last];
		r->mhs[0] = mh;
		r->flushed = 1;
		c->reflush[c->nreflush++] = r;
		return 0;
	}
	if (err)
		return err;
	r->bufs[0] = data[last];	/* a move posts it again (rail_ib_flush_replay) */
	r->mhs[0] = mh;
	return flush_post(c, r);
}

int rail_ib_flush_replay(struct rail_ib_comm *c)
{
	int err = 0;

	for (int k = 0; k < c->nreflush && !err; k++) {
		struct rail_ib_req *r = c->reflush[k];

		r->flushed = 0;
		err = flush_post(c, r);
	}
	c->nreflush = 0;
	return err;
}

int rail_ib_flush_member(struct rail_ib_comm *c, int m)
{
	return c->flush ? flush_member(c, m) : 0;
}

static int flush_post(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	struct rail_ib_mh *mh = r->mhs[0];
	int err = rail_ib_mh_keys(c, mh);	/* registered before a move: the new device's keys */

	for (int m = 0; m < c->ndevs && !err; m++) {
		struct rail_ib_devres *res = &c->res[m];
		struct ibv_sge sge = { .addr = (uintptr_t)c->flush_buf, .length = 1,
				       .lkey = res->flush_mr->lkey };
		struct ibv_send_wr wr = { .wr_id = (uintptr_t)r, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_READ,
					  .send_flags = IBV_SEND_SIGNALED };

		wr.wr.rdma.remote_addr = (uintptr_t)r->bufs[0];
		wr.wr.rdma.rkey = mh->rkey[m];
		err = rail_ib_loop_post(c, m, &wr, "flush RDMA read");
		if (err)
			return err;
		r->events[m]++;
	}
	return err;
}
