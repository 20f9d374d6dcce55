/*
 * nccl-net-rail: fault injection into the verbs wrapper table.
 *
 * NCCL_RAIL_IB_FAULT=call:ERRNO:N[+][,...] makes the N-th call (counted
 * from the end of the transport's init) of one verbs call fail with ERRNO;
 * "N+" fails the N-th and every later call. call is one of ibv_reg_mr,
 * ibv_reg_dmabuf_mr, ibv_create_qp, ibv_modify_qp, ibv_post_send,
 * ibv_post_recv, ibv_create_cq, ibv_alloc_pd; ERRNO a name (ENOMEM) or a
 * number. The wrappers fail the way libibverbs does (NULL + errno, or the
 * errno value returned), so the transport's own error paths run.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "ib/ib_verbs.h"
#include "log.h"
#include "rail.h"

enum fault_call {
	F_REG_MR,
	F_REG_DMABUF_MR,
	F_CREATE_QP,
	F_MODIFY_QP,
	F_POST_SEND,
	F_POST_RECV,
	F_CREATE_CQ,
	F_ALLOC_PD,
	F_COUNT
};

static const char *const fault_names[F_COUNT] = {
	"ibv_reg_mr", "ibv_reg_dmabuf_mr", "ibv_create_qp", "ibv_modify_qp",
	"ibv_post_send", "ibv_post_recv", "ibv_create_cq", "ibv_alloc_pd",
};

static struct rail_fault faults[F_COUNT];
static struct rail_verbs saved;	/* the table entries the wrappers replaced */
static atomic_int injected;

static int hit(enum fault_call c)
{
	int err = rail_fault_hit(&faults[c]);

	if (err) {
		atomic_fetch_add(&injected, 1);
		RAIL_INFO(RAIL_LOG_NET, "NCCL_RAIL_IB_FAULT: failing call %ld of %s with %s",
			  atomic_load(&faults[c].calls), fault_names[c], RAIL_ERRSTR(-err));
	}
	return err;
}

static struct ibv_mr *fault_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	int err = hit(F_REG_MR);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.reg_mr(pd, addr, len, access);
}

/* "ibv_reg_mr" also covers ibv_reg_mr_iova2 (used for relaxed ordering). */
static struct ibv_mr *fault_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
					 unsigned int access)
{
	int err = hit(F_REG_MR);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.reg_mr_iova2(pd, addr, len, iova, access);
}

static struct ibv_mr *fault_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					  uint64_t iova, int fd, int access)
{
	int err = hit(F_REG_DMABUF_MR);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.reg_dmabuf_mr(pd, offset, len, iova, fd, access);
}

static struct ibv_qp *fault_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	int err = hit(F_CREATE_QP);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.create_qp(pd, attr);
}

static int fault_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	int err = hit(F_MODIFY_QP);

	return err ? err : saved.modify_qp(qp, attr, mask);
}

static int fault_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	int err = hit(F_POST_SEND);

	if (err) {
		*bad = wr;
		return err;
	}
	return saved.post_send(qp, wr, bad);
}

static int fault_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int err = hit(F_POST_RECV);

	if (err) {
		*bad = wr;
		return err;
	}
	return saved.post_recv(qp, wr, bad);
}

static struct ibv_cq *fault_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				      struct ibv_comp_channel *ch, int vec)
{
	int err = hit(F_CREATE_CQ);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.create_cq(ctx, cqe, cq_context, ch, vec);
}

static struct ibv_pd *fault_alloc_pd(struct ibv_context *ctx)
{
	int err = hit(F_ALLOC_PD);

	if (err) {
		errno = err;
		return NULL;
	}
	return saved.alloc_pd(ctx);
}

static void install(enum fault_call c)
{
	switch (c) {
	case F_REG_MR:
		saved.reg_mr = rail_ibv.reg_mr;
		rail_ibv.reg_mr = fault_reg_mr;
		saved.reg_mr_iova2 = rail_ibv.reg_mr_iova2;
		if (saved.reg_mr_iova2)
			rail_ibv.reg_mr_iova2 = fault_reg_mr_iova2;
		break;
	case F_REG_DMABUF_MR:
		saved.reg_dmabuf_mr = rail_ibv.reg_dmabuf_mr;
		if (saved.reg_dmabuf_mr)
			rail_ibv.reg_dmabuf_mr = fault_reg_dmabuf_mr;
		break;
	case F_CREATE_QP:
		saved.create_qp = rail_ibv.create_qp;
		rail_ibv.create_qp = fault_create_qp;
		break;
	case F_MODIFY_QP:
		saved.modify_qp = rail_ibv.modify_qp;
		rail_ibv.modify_qp = fault_modify_qp;
		break;
	case F_POST_SEND:
		saved.post_send = rail_ibv.post_send;
		rail_ibv.post_send = fault_post_send;
		break;
	case F_POST_RECV:
		saved.post_recv = rail_ibv.post_recv;
		rail_ibv.post_recv = fault_post_recv;
		break;
	case F_CREATE_CQ:
		saved.create_cq = rail_ibv.create_cq;
		rail_ibv.create_cq = fault_create_cq;
		break;
	case F_ALLOC_PD:
		saved.alloc_pd = rail_ibv.alloc_pd;
		rail_ibv.alloc_pd = fault_alloc_pd;
		break;
	default:
		break;
	}
}

static void uninstall(enum fault_call c)
{
	switch (c) {
	case F_REG_MR:
		rail_ibv.reg_mr = saved.reg_mr;
		rail_ibv.reg_mr_iova2 = saved.reg_mr_iova2;
		break;
	case F_REG_DMABUF_MR: rail_ibv.reg_dmabuf_mr = saved.reg_dmabuf_mr; break;
	case F_CREATE_QP: rail_ibv.create_qp = saved.create_qp; break;
	case F_MODIFY_QP: rail_ibv.modify_qp = saved.modify_qp; break;
	case F_POST_SEND: rail_ibv.post_send = saved.post_send; break;
	case F_POST_RECV: rail_ibv.post_recv = saved.post_recv; break;
	case F_CREATE_CQ: rail_ibv.create_cq = saved.create_cq; break;
	case F_ALLOC_PD: rail_ibv.alloc_pd = saved.alloc_pd; break;
	default: break;
	}
}

int rail_verbs_fault_arm(const char *spec)
{
	struct rail_fault tmp[F_COUNT];
	char why[512];

	rail_verbs_fault_clear();
	if (!spec || !spec[0])
		return 0;
	if (rail_fault_parse(spec, fault_names, F_COUNT, tmp, why, sizeof(why))) {
		RAIL_WARN("NCCL_RAIL_IB_FAULT=%s ignored: %s", spec, why);
		return -EINVAL;
	}
	for (int i = 0; i < F_COUNT; i++) {
		if (!tmp[i].armed)
			continue;
		faults[i].err = tmp[i].err;
		faults[i].nth = tmp[i].nth;
		faults[i].sticky = tmp[i].sticky;
		atomic_store(&faults[i].calls, 0);
		install((enum fault_call)i);
		faults[i].armed = 1;
	}
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL_RAIL_IB_FAULT=%s armed (fault injection for "
		  "tests)", spec);
	return 0;
}

void rail_verbs_fault_clear(void)
{
	for (int i = 0; i < F_COUNT; i++) {
		if (!faults[i].armed)
			continue;
		faults[i].armed = 0;
		uninstall((enum fault_call)i);
	}
}

int rail_verbs_faults_injected(void)
{
	return atomic_load(&injected);
}
